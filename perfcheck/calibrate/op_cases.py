"""The per-op cases of ``perfcheck calibrate`` on a CPU (and the per-op fixed costs on a GPU): each
aten op's fixed cost alone and among other ops, per-module fixed costs, per-op kernel efficiency; the row
counts and length of the per-row cases (perfcheck.calibrate.op_classes). The timer, the runner and the device cases are
``calibrate.cases``; the fit of these rows is ``calibrate.fit_host``.
"""
from __future__ import annotations

import time

import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.cases import Case, cache_bytes
from perfcheck.calibrate.layers import CallModule, cold_filler, tiny_modules
from perfcheck.hardware.systems import normalize_dtype, torch_dtype
from perfcheck.predict.aten_costs import cost_of
from perfcheck.predict.trace import trace_model


# ------------------------------------------------------------------------------ per-op kernel costs (CPU)
def tiny_ops(dev, dtype=torch.float32, grad: bool = False):
    """aten op name -> a call of it on tiny tensors (nothing to compute: dispatch + the kernel's fixed cost).
    ``dtype``/``grad``: the floating tensors' dtype and whether they need a gradient (each call then builds its
    autograd node, as a training step's forward does; the graph is freed with the call's output)."""
    F = torch.nn.functional

    def t(*shape, fill=None):
        x = torch.randn(*shape, device=dev) if fill is None else torch.full(shape, float(fill), device=dev)
        return x.to(dtype).requires_grad_(grad)
    y, w, b = t(8, 16), t(16, 5), t(5)
    img, k = t(1, 1, 6, 6), t(1, 1, 3, 3)
    img2 = t(2, 1, 6, 6)
    # running statistics are buffers (never need a gradient), in the model's dtype
    rm, rv = torch.zeros(16, device=dev, dtype=dtype), torch.ones(16, device=dev, dtype=dtype)
    g, beta = t(16, fill=1), t(16, fill=0)
    bat = t(2, 4, 4)
    idx, table = torch.arange(8, device=dev), t(16, 4)
    return {
        "addmm": lambda: torch.addmm(b, y, w), "mm": lambda: torch.mm(y, w), "bmm": lambda: torch.bmm(bat, bat),
        # a batch of 2, the path a training batch takes: on a CPU a batch-1 convolution runs another kernel
        # (10 us for this 1->1 channel 3x3 on 6x6 on the project's VM) than batch >= 2 (119 us, the same at
        # batch 8): the fixed cost a LeNet-size convolution pays, which the op_efficiency fit subtracts
        "convolution": lambda: F.conv2d(img2, k),
        "native_batch_norm": lambda: F.batch_norm(y, rm, rv, g, beta, training=True),
        "native_layer_norm": lambda: F.layer_norm(y, (16,)), "sum": lambda: y.sum(0), "mean": lambda: y.mean(0),
        "_log_softmax": lambda: F.log_softmax(y, 1), "_softmax": lambda: F.softmax(y, 1),
        "max_pool2d_with_indices": lambda: F.max_pool2d(img, 2), "relu": lambda: F.relu(y),
        "gelu": lambda: F.gelu(y), "embedding": lambda: F.embedding(idx, table),
    }


#: Low-precision dtypes whose per-op host costs calibration measures apart on CUDA (``op_fixed_cases``'
#: ``dtypes``): on the H100 VM of 2026-11-26 a LeNet forward with gradients cost 467 us of host time per call in
#: bf16 against 209 us in fp32 (cuBLAS/cuDNN bf16 paths: Linear 30 vs 17 us, LeNet's conv2 73 vs 25 us; even
#: relu/max-pool with autograd +4 us), while the fp32 cases priced it at ~200 us
#: (bench/gpu_results/2026-11-26-h100/diag_ops.log).
HOST_DTYPES_CUDA = ("bf16",)


def op_fixed_cases(device, dtypes=()) -> list:
    """One tiny call per aten op family (label = the op's name): its time less one plain tiny op's
    is that family's fixed cost (``op_fixed_s``): on a CPU the kernel's set-up, on a GPU the host's
    (cuDNN/cuBLAS heuristics and descriptors: a loop of tiny calls is host-bound there).
    fp32 cases run without gradients (the autograd node is priced apart, autograd_node_s); each dtype of
    ``dtypes`` (bf16, fp16) adds the same calls in that dtype on tensors that need a gradient, as a training
    step's forward runs them (dtype column = that dtype; fit.py keys them ``<op>@<dtype>``)."""
    dev = torch.device(device)
    out = [Case(names.OPFIXED, name, fn, "fp32", host=True) for name, fn in tiny_ops(dev).items()]
    for dt in dtypes:
        out += [Case(names.OPFIXED, name, fn, dt, host=True)
                for name, fn in tiny_ops(dev, torch_dtype(dt), grad=True).items()]
    return out


def op_cold_cases(device, dtypes=()) -> list:
    """The op_fixed cases' tiny ops called one after another (label ``round-robin xN``, time per op): each
    call follows a different op, as a training step runs its ops, where the op_fixed cases repeat one op in
    a tight loop that keeps its code, its branch history and its tensors in the core. Per op, this case less
    the mean of the same ops' tight loops is the host time an op costs beyond its tight-loop price inside a
    step (``op_cold_s``, fit.py). Why: on the project's VM the 14 ops took 268.6 us in a round-robin against
    124.1 us summed over their tight loops (+10.3 us per op; 11.1-13.5 us once the convolution ran a batch of
    2), and the same excess is what a LeNet or JSC forward inside a training step costs beyond a warm per-op
    model (bench/RESULTS.md, issue 12). Followed by the same round-robins after a cold filler
    (``op_cold_filler_cases``)."""
    dev = torch.device(device)
    # per dtype of ``dtypes``: the same ops in that dtype with gradients, as op_fixed_cases' cases of that dtype
    per_dtype = [("fp32", list(tiny_ops(dev).values()))] + [
        (dt, list(tiny_ops(dev, torch_dtype(dt), grad=True).values())) for dt in dtypes]
    return ([_round_robin(dt, ops) for dt, ops in per_dtype] + op_cold_filler_cases(dev, per_dtype)
            + op_cold_near_cases(dev) + op_cold_light_cases(dev))


def op_cold_near_cases(device) -> list:
    """The fp32 round-robin again without the convolution (label ``round-robin near x13``, time per op): each op's
    family ran 12 light families ago (``perfcheck.predict.family_reuse.NEAR_DISTANCE``), as a recurrent layer's
    time step repeats its cell's ops. Its excess over the same ops' tight loops is ``op_cold_near_s``
    (fit_cold.op_cold_near_excess). Why: on the project's Xeon (1 thread, process time,
    bench/results/op_family_reuse.md) the 14-op round-robin cost 2.4 us per op above the tight loops and 1.0 us
    without the convolution, and a cycle over 2-24 light families 0.2-0.5 us. Placed after the other OPCOLD
    rows (a table's first tight round-robin is the 14-op one, which op_cold_excess reads)."""
    ops = [fn for name, fn in tiny_ops(torch.device(device)).items() if name not in names.NEAR_LEFT_OUT]
    def round_robin():
        for fn in ops:
            fn()
    return [Case(names.OPCOLD, names.near_label(len(ops)), round_robin, "fp32", per_call=len(ops), host=True)]


#: Bytes the far round-robin writes before each round, in multiples of the L3 (not strictly LRU, and shared).
FAR_EVICT_MULTIPLE = 4
#: The largest L3 the far case evicts (its buffer is FAR_EVICT_MULTIPLE times that): above it the case is skipped
#: and no op is priced far (a step of one thread rarely streams more between two calls of a family).
FAR_MAX_L3_BYTES = 64 * 2 ** 20


def evictable_l3_bytes(dev) -> int:
    """The L3 the far and residency cases evict and re-read: sysfs's size on a CPU, 0 (no case) on a GPU, where
    sysfs gives none, or above ``FAR_MAX_L3_BYTES``."""
    l3 = cache_bytes(3)
    return l3 if torch.device(dev).type == "cpu" and 0 < l3 <= FAR_MAX_L3_BYTES else 0


def _evict_and_rewarm(dev, l3: int):
    """The far cases' ``between``: write ``FAR_EVICT_MULTIPLE`` times the L3, then re-warm the path every op shares
    (a few tiny adds: dispatcher, TensorIterator, allocator, the interpreter)."""
    flush = torch.empty(FAR_EVICT_MULTIPLE * l3 // 4, device=dev)
    a, b = torch.ones(4, device=dev), torch.ones(4, device=dev)

    def evict_and_rewarm():
        flush.add_(1.0)
        for _ in range(4):
            torch.add(a, b)
    return evict_and_rewarm


def op_cold_far_cases(device) -> list:
    """The fp32 round-robin of ``op_cold_cases``, each round timed after writing ``FAR_EVICT_MULTIPLE`` times the L3
    and then re-warming the path every op shares (a few tiny adds: dispatcher, TensorIterator, allocator, the
    interpreter; ``add`` is none of the round-robin's families), label ``round-robin far xN``, time per op, ``m`` =
    the L3 bytes. Its excess over the ops' tight loops is ``op_cold_far_s`` (fit_cold.op_cold_far_excess): what an
    op pays when more than the L3 of data streamed through the core since its family last ran, so its own code
    (and its data) come from memory (``perfcheck.predict.family_reuse.far_reuse``). CPU only; none where sysfs gives
    no L3 or one above ``FAR_MAX_L3_BYTES``.
    Why: on an AMD EPYC VM (2 vCPUs, L2 1 MiB, L3 32 MiB; 1 thread, process time, 2026-11-27) a tiny 32^3 mm took
    5.4 us after an L2 eviction and 43 us after an L3 eviction with the shared path re-warmed, a 16 Ki-element
    layer norm 13.7 and 95 us (bench/cache_levels.py); there the held-out models' LayerNorm modules ran 53-143 us
    per call above their prediction (fwd + bwd), and every held-out step read 1.1-1.5x, where the project's Xeon (L3
    300 MiB as its VM reports it) read 0.97-1.06 (bench/results/heldout.md)."""
    dev = torch.device(device)
    l3 = evictable_l3_bytes(dev)
    if not l3:
        return []
    evict_and_rewarm = _evict_and_rewarm(dev, l3)
    ops = list(tiny_ops(dev).values())

    def round_robin():
        for fn in ops:
            fn()
    return [Case(names.OPCOLD, names.far_label(len(ops)), round_robin, "fp32", shape=(l3, 0, 0), per_call=len(ops),
                 between=evict_and_rewarm, host=True)]


def step_start_cases(device) -> list:
    """The step-start pair (``host.step_start_s``, fit_cold.step_start_excess), where ``op_cold_far_cases`` runs:
    ``STEP_START``: a tiny ``nn.Linear`` module call (parameters needing a gradient, as a training step's forward
    records them) timed after a step of other code (a small MLP's forward, backward and AdamW step) and then the far
    case's eviction and re-warm; ``STEP_START_OP``: the bare op that module runs (``torch.addmm``) after the eviction
    and re-warm alone. Their difference is what the first module call of a training step pays beyond its op's far
    price: the module call and autograd-recording path, and code the step before ran in between, cold.
    Why: on an AMD EPYC VM (1 thread, process time, 2026-11-28) the first embedding of a training step (nn_encoder,
    lstm_lm) ran 113-127 us against 56-70 predicted; warming a tiny nn.Embedding just before the forward brought it to
    49-68 us (the prediction), warming the shared path (tiny adds) 105-126 (nothing), and a tiny module call after a
    step of other code cost 14-36 us more than after the eviction alone."""
    dev = torch.device(device)
    l3 = evictable_l3_bytes(dev)
    if not l3:
        return []
    evict_and_rewarm = _evict_and_rewarm(dev, l3)
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(16, 5).to(dev)
    y = torch.rand(8, 16, generator=g).to(dev)
    w_t, bias = lin.weight.detach().t(), lin.bias.detach()
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                              torch.nn.Linear(64, 8)).to(dev)
    opt = torch.optim.AdamW(mlp.parameters(), lr=1e-3)
    x_in, target = torch.rand(16, 32, generator=g).to(dev), torch.rand(16, 8, generator=g).to(dev)

    def step_then_evict():
        torch.nn.functional.mse_loss(mlp(x_in), target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        evict_and_rewarm()
    return [Case(names.OPCOLD, names.STEP_START, lambda: lin(y), "fp32", shape=(l3, 0, 0), between=step_then_evict,
                 host=True),
            Case(names.OPCOLD, names.STEP_START_OP, lambda: torch.addmm(bias, y, w_t), "fp32", shape=(l3, 0, 0),
                 between=evict_and_rewarm, host=True)]


#: Sleeps (seconds) after which the residency cases re-read their buffer: where the L3 is shared with other tenants'
#: cores, data left in it decays with time even while this process sleeps.
RESIDENCY_WAITS_S = (0.002, 0.008)


def l3_residency_cases(device) -> list:
    """How long data stays in the L3 (``host.l3_residency_s``, fit_cold.l3_residency): a read (``sum``) of a quarter
    of the L3, timed right after the same read (hot), after the same read, a read of 2x the L2 and a sleep of each of
    ``RESIDENCY_WAITS_S``, and after writing 4x the L3 (evicted); label ``l3 residency <hot | N us | evicted>``, ``m``
    = the L3 bytes, ``n`` = the sleep in microseconds. CPU only, where ``op_cold_far_cases`` runs.
    Why: on an AMD EPYC VM (L3 32 MiB, 2026-11-27) an 8 MiB buffer read at 84 GB/s right after its last read, 38 GB/s
    after 5 ms asleep and 17-20 GB/s (as evicted) after 20 ms: the L3 is shared with other tenants' cores, so what an
    op finds there depends on the time since its last use, not only on this process's data in between
    (bench/results/cache_levels.md)."""
    dev = torch.device(device)
    l3 = evictable_l3_bytes(dev)
    if not l3:
        return []
    buf = torch.ones(l3 // 16, device=dev)  # a quarter of the L3, fp32
    l2 = torch.ones(2 * cache_bytes(2) // 4, device=dev)
    flush = torch.empty(FAR_EVICT_MULTIPLE * l3 // 4, device=dev)

    def after(wait_s):
        def prepare():
            buf.sum()
            l2.sum()
            time.sleep(wait_s)
        return prepare

    waits = [(0, buf.sum)] + [(int(round(w * 1e6)), after(w)) for w in RESIDENCY_WAITS_S] + \
        [(-1, lambda: flush.add_(1.0))]
    return [Case(names.OPCOLD, names.residency_label(us), buf.sum, "fp32", shape=(l3, 0, max(us, 0)),
                 between=between, host=True) for us, between in waits]


def light_ops(dev) -> dict:
    """aten family -> a call of it on tiny tensors: 13 light families (``family_reuse.is_light``: pointwise ops in
    place and not, a copy, a small GEMM), so in a cycle each family's last call was 12 others ago, the distance
    ``family_reuse.NEAR_DISTANCE`` covers."""
    g = torch.Generator().manual_seed(0)
    a, b, s = (torch.rand(8, 16, generator=g).to(dev) for _ in range(3))
    w, bias = torch.rand(16, 16, generator=g).to(dev), torch.rand(16, generator=g).to(dev)
    return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / (b + 1),
            "add_": lambda: s.add_(b), "mul_": lambda: s.mul_(1.0), "sigmoid_": lambda: s.sigmoid_(),
            "tanh_": lambda: s.tanh_(), "sigmoid": lambda: a.sigmoid(), "tanh": lambda: a.tanh(),
            "relu": lambda: a.relu(), "clone": lambda: a.clone(), "addmm": lambda: torch.addmm(bias, a, w)}


def op_cold_light_cases(device) -> list:
    """Two OPCOLD cases over ``light_ops``: one call of each family in turn (label ``round-robin light x13``, time
    per op) and each family ``case_names.LIGHT_TIGHT_RUN`` times in a row before the next (``light tight x13``, time per op:
    the families' tight-loop mean, timed in the same case run a moment apart rather than by the op_fixed cases).
    The first less the second is ``op_cold_light_s`` (fit_cold.op_cold_light_excess). Why: on the project's Xeon
    (1 thread, process time, bench/results/host_switch.md) a switch among such families cost 0.1-0.75 us, the near
    round-robin's 1.4 us, of which its norms, pooling, mean, gelu and embedding made most; and the near price,
    a difference against tight loops timed minutes apart, swung 2.3-5.5 us between calibrations.
    NB: the tight run pays 1 switch per ``case_names.LIGHT_TIGHT_RUN`` ops (subtracted once by the fit: negligible)."""
    ops = list(light_ops(torch.device(device)).values())
    rr, tight = names.light_labels(len(ops))

    def round_robin():
        for fn in ops:
            fn()

    def tight_runs():
        for fn in ops:
            for _ in range(names.LIGHT_TIGHT_RUN):
                fn()
    return [Case(names.OPCOLD, rr, round_robin, "fp32", per_call=len(ops), host=True),
            Case(names.OPCOLD, tight, tight_runs, "fp32", per_call=len(ops) * names.LIGHT_TIGHT_RUN, host=True)]


def _round_robin(dt: str, ops, between=None) -> Case:
    """One call of each of ``ops`` in turn (time per op: ``per_call`` = the ops)."""
    def round_robin():
        for fn in ops:
            fn()
    return Case(names.OPCOLD, names.round_robin_label(len(ops), after_filler=between is not None), round_robin, dt,
                per_call=len(ops), between=between, host=True)


def op_cold_filler_cases(device, per_dtype) -> list:
    """The round-robin of ``op_cold_cases`` again, each call timed alone after the cold filler
    (``layers.cold_filler``: a forward and backward through other layers, untimed; ``Case.between``, as the
    once-per-step cases run), per (dtype, ops) of ``per_dtype``: label ``round-robin after filler xN``, time per
    op. Why: a step runs each op once, after a backward and an optimizer step have run other code, not after
    the other tiny ops a moment ago; on the H100 VM of 2026-11-26 a bf16 LeNet forward with gradients cost 216
    us of host time in a forward-only loop and 382 us as a training step's forward (diag_ops.log,
    diag_phases.log), while the tight round-robin's excess was 2.5-3.3 us per op (12 ops: +14 us of the +166).
    Run on every device; fit.op_cold_excess takes op_cold_s from it for a GPU spec (fit_cold.AFTER_FILLER_KINDS;
    a CPU keeps the tight round-robin's, this row recorded beside it)."""
    cold = cold_filler(device)
    return [_round_robin(dt, ops, between=cold) for dt, ops in per_dtype]


def module_fixed_cases(device) -> list:
    """One call per standard nn module class (label = the class name, see perfcheck.calibrate.layers)."""
    return [Case(names.MODFIXED, name, (lambda m=m, x=x: m(*x)), "fp32", host=True)
            for name, (m, x) in tiny_modules(device).items()]


def _formula_cost(fn, inputs, name: str) -> tuple:
    """(matrix FLOPs, other FLOPs, bytes) of the forward ``name`` ops ``fn(*inputs)`` runs, by the estimator's formulas."""
    trace = trace_model(CallModule(fn), inputs)
    mf = of = nb = 0.0
    for op in trace.ops:
        if op.call.name == name and not op.backward_only:
            c = cost_of(op.call).cost.fwd
            mf, of, nb = mf + 2 * c.macs, of + c.flops, nb + c.bytes
    return mf, of, nb


def op_efficiency_cases(device, dtypes=("fp32",)) -> list:
    """Kernels that run far below the roofline at small channel counts, at a LeNet-like size (label =
    the op's name): a 3->6 channel 5x5 convolution on CIFAR images (8 on a CPU, 256 on a GPU, so
    the GPU's kernel, not its host, is timed) and a 2x2 max-pool of its output, in each of ``dtypes``
    (a str or several; tf32 runs on fp32 tensors and is left to fp32: a kernel's efficiency depends on its
    dtype, and the fit keeps one per dtype). ``flops`` holds the matrix FLOPs, ``bytes`` the bytes and ``n``
    the other FLOPs of the formulas."""
    F = torch.nn.functional
    dev = torch.device(device)
    batch = 256 if dev.type == "cuda" else 8
    wanted = [normalize_dtype(d) for d in ((dtypes,) if isinstance(dtypes, str) else dtypes)]
    out = []
    for dtype in dict.fromkeys("fp32" if d == "tf32" else d for d in wanted):
        tdt = torch_dtype(dtype)
        x, w, b = (torch.randn(batch, 3, 32, 32, device=dev, dtype=tdt),
                   torch.randn(6, 3, 5, 5, device=dev, dtype=tdt), torch.randn(6, device=dev, dtype=tdt))
        y = torch.randn(batch, 6, 28, 28, device=dev, dtype=tdt)
        for name, fn, inputs in (("convolution", F.conv2d, (x, w, b)),
                                 ("max_pool2d_with_indices", lambda t: F.max_pool2d(t, 2, 2), (y,))):
            mf, of, nb = _formula_cost(fn, inputs, name)
            out.append(Case(names.OPEFF, name, (lambda fn=fn, inputs=inputs: fn(*inputs)), dtype, mf, nb, (0, 0, int(of))))
    return out


# ------------------------------------------------------------------------------ per-row costs (CPU; op_classes' row cases)
#: Row length (columns) of the per-row cases: 20 fp32 elements, the length the embedding and convolution-weight
#: cases ran at on the project's AVX-512 machine when the row-wise ops' length terms were retired
#: (bench/results/pruning.md; they had tied it to the SIMD width).
ROW_CASE_LENGTH = 20
