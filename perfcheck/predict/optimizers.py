"""What one ``torch.optim`` step runs, per parameter tensor, counted from torch's own code.

Why counted and not tabulated: the 15 optimizers of ``torch.optim`` x their variants (momentum, Nesterov, weight
decay, amsgrad, centered) x their implementations (for-loop, foreach, fused) run different kernel sequences,
and torch changes them between releases (Adam's for-loop update in torch 2.13 runs lerp_, mul_, addcmul_,
sqrt, div, add_, addcdiv_: 18 parameter-sized memory streams per element, not the 7 of a textbook count).
``profile(kind, impl)`` runs the optimizer once on tiny CPU tensors under a dispatch mode that records every aten
op, and derives from the schema of each op:

  streams per kernel   per parameter-sized tensor an op touches: 1 per input read, 2 per argument written in
                       place (read + write; schema alias_info.is_write), 1 per fresh output of parameter size
  kernels per tensor   ops that touch a parameter-sized tensor, per parameter tensor (a foreach op over a list
                       counts once per list element: on a CPU it loops over them)
  host ops per tensor  element-ops (an op counts 1, a foreach op its list length) per extra parameter tensor,
                       from two runs with 2 and 3 tensors (the slope; the step's own ops are the intercept)
  matmuls per tensor   mm/addmm/bmm/baddbmm per tensor (Muon's Newton-Schulz iterations)
  square roots         sqrt kernels per tensor over a parameter-sized tensor (Adam's, RMSprop's, Adagrad's
                       denominator: the root of a second-moment state, which stays exactly 0 where the gradient
                       always was; a CPU's sqrt of 0 takes a slow path, ``perfcheck.predict.zero_rows``)

Kind names: the class name in lower case, then the variant flags that change the kernels, ``_``-joined in
``FLAGS`` order: ``sgd``, ``sgd_momentum``, ``sgd_momentum_nesterov``, ``adam``, ``adam_wd``,
``adam_amsgrad``, ``adamw`` (AdamW decays by default: its decay is part of ``adamw``), ``rmsprop_momentum_centered``,
``adagrad``, ``lbfgs``, ...; an implementation suffix ``-for-loop``/``-foreach``/``-fused`` is host.py's.

NB (perfcheck): LBFGS is profiled for one iteration of its algebra (its closure's forward and backward are the
model's; it may run up to ``max_iter`` of them per step); SparseAdam with gradients as dense as its parameters
(an upper bound: real sparse gradients touch fewer rows); Muon's matmuls are priced on square parameters.
How a profile becomes ``pred_optim_s``: docs/model.md (section 4).
"""
from __future__ import annotations

import dataclasses
import inspect
from functools import lru_cache

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perfcheck.errors import UserError

#: Variant flags in kind names, in order, and the constructor arguments each sets when profiling.
FLAGS = {"momentum": {"momentum": 0.9}, "nesterov": {"nesterov": True}, "wd": {"weight_decay": 0.01},
         "amsgrad": {"amsgrad": True}, "centered": {"centered": True}}
#: Shapes of the parameter tensors the profile runs on: 2-D (Adafactor factors and Muon orthogonalises matrices),
#: numels no other tensor of a step has (the step counters, Adafactor's row/column factors).
PROFILE_SHAPES = ((6, 7), (5, 11), (9, 13))
_MATMULS = ("mm", "addmm", "bmm", "baddbmm")
_SQRTS = ("sqrt", "sqrt_", "_foreach_sqrt", "_foreach_sqrt_")


@dataclasses.dataclass(frozen=True)
class Profile:
    """Per parameter tensor: ``kernels`` = streams of each parameter-sized kernel (elements read + written, per
    element of the tensor); ``host_ops`` = element-ops; ``matmuls``; ``step_ops``: ops once per step; ``sqrts``:
    square-root kernels over a parameter-sized tensor (a fused kernel's own root is inside it: 0)."""

    kind: str
    implementation: str
    kernels: tuple
    host_ops: float
    matmuls: float
    step_ops: float
    sqrts: float = 0.0
    #: the aten op of each entry of ``kernels`` (same order: ``sqrt``, ``addcdiv_``, ``_foreach_lerp_``, ...), for
    #: its measured price per element (``SystemSpec.op_flop_s``); empty in a hand-made profile
    names: tuple = ()
    #: parameter-sized tensors that outlive the step, per parameter: the parameter, its gradient and the states of
    #: its size (SGD 2, with momentum 3, Adam 4, with amsgrad 5): what a step must fetch once when it starts far
    #: from them (``host.optimizer_time``'s ``far``)
    persistent: float = 2.0

    @property
    def streams(self) -> float:
        return float(sum(self.kernels))


def classes() -> dict:
    """lower-case name -> every torch.optim optimizer class of this torch build."""
    return {n.lower(): c for n, c in vars(torch.optim).items()
            if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}


def parse(kind: str) -> tuple:
    """``(class, flags)`` of a kind name; UserError naming the unknown part."""
    base, *flags = kind.split("_")
    known = classes()
    if base not in known:
        raise UserError(f"optimizer: unknown {kind!r} (known: {', '.join(sorted(known))}, with variants "
                        f"{', '.join('_' + f for f in FLAGS)}, optionally -foreach, -fused or -for-loop)")
    bad = [f for f in flags if f not in FLAGS]
    if bad:
        raise UserError(f"optimizer: unknown variant {bad[0]!r} in {kind!r} (known: {', '.join(FLAGS)})")
    return known[base], tuple(f for f in FLAGS if f in flags)


def kind_of(optimizer) -> str:
    """The kind name of a torch.optim instance, from its class and first param group."""
    base = type(optimizer).__name__.lower()
    if base not in classes():
        raise UserError(f"optimizer: {type(optimizer).__name__} is not a torch.optim optimizer")
    g = optimizer.param_groups[0] if getattr(optimizer, "param_groups", None) else {}
    flags = [f for f, ok in (("momentum", g.get("momentum", 0) and base in ("sgd", "rmsprop")),
                             ("nesterov", g.get("nesterov", False)),
                             ("wd", g.get("weight_decay", 0) and base != "adamw"),
                             ("amsgrad", g.get("amsgrad", False)), ("centered", g.get("centered", False))) if ok]
    return "_".join([base] + flags)


def _kwargs(cls, flags, impl) -> dict:
    params = inspect.signature(cls.__init__).parameters
    kw = {"lr": 1e-3} if "lr" in params else {}
    for f in flags:
        kw.update(FLAGS[f])
    if impl == "foreach":
        kw["foreach"] = True
    elif impl == "fused":
        kw["fused"] = True
    elif "foreach" in params:
        kw["foreach"] = False
    missing = [k for k in kw if k not in params]
    if missing:
        raise UserError(f"optimizer: torch.optim.{cls.__name__} has no {missing[0]!r} (variant or implementation "
                        f"{impl!r} does not exist for it)")
    return kw


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out


def _flat(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)


def _count(ops, sizes) -> tuple:
    """((streams, op name) per kernel, element-ops, matmuls, square roots) of the recorded ``ops`` over parameter
    numels ``sizes``."""
    kernels, elem_ops, mm, roots = [], 0, 0, 0
    for func, args, kwargs, out in ops:
        schema = func._schema
        per = {}
        for i, a in enumerate(schema.arguments):
            val = args[i] if i < len(args) else kwargs.get(a.name)
            written = a.alias_info is not None and a.alias_info.is_write
            for j, t in enumerate(_flat(val)):
                if t.numel() in sizes:
                    per[j] = per.get(j, 0) + (2 if written else 1)
        fresh = [r.alias_info is None for r in schema.returns]
        # one return that is a list (a foreach op's) is one return: its j-th tensor is the j-th kernel's output
        outs = out if len(schema.returns) > 1 else (out,)
        for k, o in enumerate(outs):
            for j, t in enumerate(_flat(o)):
                if (k >= len(fresh) or fresh[k]) and t.numel() in sizes:
                    per[j] = per.get(j, 0) + 1
        lists = [len(v) for v in list(args) + list(kwargs.values()) if isinstance(v, (list, tuple))
                 and v and isinstance(v[0], torch.Tensor)]
        elem_ops += max(lists) if lists else 1
        kernels += [(s, func.overloadpacket.__name__) for s in per.values() if s]
        mm += func.overloadpacket.__name__ in _MATMULS
        roots += sum(1 for s in per.values() if s) if func.overloadpacket.__name__ in _SQRTS else 0
    return kernels, elem_ops, mm, roots


def _run(cls, kw, shapes):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
    sparse = cls is torch.optim.SparseAdam
    opt = cls(params, **kw)

    def grads():
        for p in params:
            g = torch.randn(p.shape, generator=gen)
            p.grad = g.to_sparse() if sparse else g
    rec = _Record()
    closure = (lambda: torch.tensor(1.0)) if cls is torch.optim.LBFGS else None
    grads()
    opt.step(closure) if closure else opt.step()  # the first step creates the state: not what a step costs
    grads()
    states = [sum(1 for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.numel() == p.numel())
              for p in params]
    with rec:
        opt.step(closure) if closure else opt.step()
    return _count(rec.ops, {int(torch.Size(s).numel()) for s in shapes}) + (2.0 + sum(states) / len(states),)


def _third_tensor(k2, k3) -> list:
    """(streams, op name) of each kernel on one more tensor: the 3-tensor run's kernels less the 2-tensor run's,
    sorted."""
    extra = list(k3)
    for s in k2:
        if s in extra:
            extra.remove(s)
    return sorted(extra)


@lru_cache(maxsize=None)
def profile(kind: str, impl: str) -> Profile:
    """The per-tensor work of one ``kind`` step in implementation ``impl`` (for-loop, foreach, fused), counted
    on this torch build (module docstring). UserError for an unknown kind or an implementation the class lacks."""
    cls, flags = parse(kind)
    kw = _kwargs(cls, flags, impl)
    try:
        k2, e2, m2, r2, _ = _run(cls, kw, PROFILE_SHAPES[:2])
        k3, e3, m3, r3, persistent = _run(cls, kw, PROFILE_SHAPES)
    except (RuntimeError, ValueError) as exc:
        raise UserError(f"optimizer: torch.optim.{cls.__name__} ({kind}, {impl}) does not run on CPU tensors here: "
                        f"{str(exc).splitlines()[0][:160]}") from None
    per_tensor = e3 - e2
    extra = _third_tensor(k2, k3)
    return Profile(kind, impl, tuple(s for s, _ in extra), float(per_tensor), float(m3 - m2),
                   float(e2 - 2 * per_tensor), float(r3 - r2), tuple(n for _, n in extra), float(persistent))


@lru_cache(maxsize=None)
def clip_profile(impl: str = "foreach") -> Profile:
    """The per-tensor work of ``torch.nn.utils.clip_grad_norm_`` in implementation ``impl`` (foreach, for-loop),
    counted like ``profile`` on this torch build: the norm of every gradient, then every gradient scaled in place by
    min(1, max_norm / total norm), which torch applies whether or not the norm exceeds max_norm (no host sync)."""
    if impl not in ("foreach", "for-loop"):
        raise UserError(f"grad_clip: torch's clip_grad_norm_ runs foreach or for-loop, got {impl!r}")

    def run(shapes):
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in shapes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        rec = _Record()
        with rec:
            torch.nn.utils.clip_grad_norm_(params, 1e-3, foreach=impl == "foreach")
        return _count(rec.ops, {int(torch.Size(s).numel()) for s in shapes})

    k2, e2, *_ = run(PROFILE_SHAPES[:2])
    k3, e3, *_ = run(PROFILE_SHAPES)
    extra = _third_tensor(k2, k3)
    return Profile("clip_grad_norm", impl, tuple(s for s, _ in extra), float(e3 - e2), 0.0,
                   float(e2 - 2 * (e3 - e2)), 0.0, tuple(n for _, n in extra), 2.0)
