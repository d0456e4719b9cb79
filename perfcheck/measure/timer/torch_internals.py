"""Every torch internal the module timer touches, in one place.

The timer needs a few things torch has no public API for (autograd's current graph task, the
instance slot ``Module.__call__`` consults before ``_call_impl``, the module-hook registries,
a cheap node pre-hook route, the end-of-backward callback queue). Each is named here once, with the
torch versions it was checked on, so that a torch upgrade has one file to review; the other timer
modules import these names and never reach into ``torch._C`` or private attributes themselves.

"Checked on" means: the test suite (tests/measure/test_timer_paths.py, tests/test_measure_timer*.py)
passes on that version with the fast route in use. "Since" cites the torch change that added the
thing where it was looked up in torch's history; otherwise only the checked version is stated.
Where an internal is missing the timer falls back to a public route (noted per item).
"""
from __future__ import annotations

import types

import torch
from torch.nn.modules import module as module_globals  # noqa: F401 (the hook registries, read per call)

_Module = torch.nn.Module
MISSING = object()

# --------------------------------------------------------------------------- autograd engine
#: ``torch._C._current_graph_task_id()``: the id of the backward pass running on this thread, -1
#: outside backward. A forward call made while it is not -1 is activation-checkpoint recompute; a
#: node hook tags its event with it (one end-of-backward callback per pass). Checked on torch 2.13.0;
#: torch's own checkpointing (torch/utils/checkpoint.py) and ModTracker (torch/distributed/_tools/
#: mod_tracker.py, ``is_bw``) use it the same way (pytorch/pytorch#143108 makes compiled autograd set it).
graph_task_id = torch._C._current_graph_task_id


def queue_callback(fn) -> None:
    """``Variable._execution_engine.queue_callback``: run ``fn`` once the current backward pass has
    run every node (rule (d), and the end-of-backward interval ``bwd_finalize_s``). Callbacks run in
    queue order, also those queued while they run. Only valid inside a backward pass. Checked on
    torch 2.13.0; the same call DDP, FSDP2 and ModTracker make."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


# --------------------------------------------------------------------------- nn.Module call route
#: The direct route (``TimedForward`` in the slot ``_compiled_call_impl``): torch's ``Module.__call__``
#: is ``_wrapped_call_impl``, which calls an instance's ``_compiled_call_impl`` when set (what
#: ``Module.compile()`` stores, ``torch.compile(self._call_impl)``: pytorch/pytorch#150209), else
#: ``_call_impl``. ``_wrapped_call_impl`` appeared with pytorch/pytorch#97565 (torch 2.1); the
#: instance slot with ``Module.compile()`` (torch 2.2). ``Module.__getstate__`` drops the slot, so
#: copies and pickles never carry the timer along. Checked on torch 2.13.0. False on a torch without
#: it: every wrapped module is then timed through an instance ``forward`` (~1 us more per call).
#: (A module global, read at attach: tests set it False to exercise the forward route.)
DIRECT_ROUTE = (getattr(_Module, "_wrapped_call_impl", None) is _Module.__call__
                and getattr(_Module, "_compiled_call_impl", MISSING) is None)
DIRECT_SLOT = "_compiled_call_impl"


def direct(mod) -> bool:
    """Whether ``mod`` can be timed in the ``_compiled_call_impl`` slot: torch's own ``__call__`` and
    ``_call_impl`` (a class overriding either would skip ours), and the slot unset (not compiled)."""
    cls = type(mod)
    return (DIRECT_ROUTE and cls.__call__ is _Module.__call__ and cls._call_impl is _Module._call_impl
            and mod.__dict__.get(DIRECT_SLOT) is None)


def has_own_hooks(mod) -> bool:
    """The module's own hook dicts (``_forward_pre_hooks`` ...): ``_call_impl``'s no-hook test reads
    the same four. Checked on torch 2.13.0 (the dict names are unchanged since torch 1.x)."""
    return bool(mod._forward_pre_hooks or mod._forward_hooks or mod._backward_hooks or mod._backward_pre_hooks)


def global_module_hooks() -> bool:
    """Process-wide module hooks (``register_module_forward_hook`` ...), kept in
    ``torch.nn.modules.module`` globals; the lean path reads them inline. Checked on torch 2.13.0."""
    g = module_globals
    return bool(g._global_forward_pre_hooks or g._global_forward_hooks
                or g._global_backward_pre_hooks or g._global_backward_hooks)


def torch_compiled(mod) -> bool:
    """A ``torch.compile(module)`` result (``OptimizedModule`` keeps the original in ``_orig_mod``) or
    a ScriptModule: timed with forward hooks, never with an instance attribute. Checked on 2.13.0."""
    return isinstance(mod, torch.jit.ScriptModule) or hasattr(mod, "_orig_mod")


#: ``torch._C._get_tracing_state()``: a TorchScript trace is running (``_call_impl`` then takes its
#: slow path; so does the direct route). Checked on torch 2.13.0.
tracing_state = torch._C._get_tracing_state

# --------------------------------------------------------------------------- compile / capture
#: ``torch.compiler.is_compiling()`` is ``_is_compiling_flag`` (export/AOT tracing) behind a
#: ``torch.jit.is_scripting()`` call: two Python frames per module call. The lean path asks the same
#: question in one trivial frame: ``is_dynamo_compiling()`` (False in eager; dynamo folds it to True
#: while it traces, as it does ``is_compiling()``) or the flag itself. Checked on torch 2.13.0; on a
#: torch without them the public function, and a flag that is never set.
is_compiling = torch.compiler.is_compiling
if hasattr(torch.compiler, "is_dynamo_compiling") and hasattr(torch.compiler, "_is_compiling_flag"):
    dynamo_compiling, compiler_flags = torch.compiler.is_dynamo_compiling, torch.compiler
else:
    dynamo_compiling, compiler_flags = is_compiling, types.SimpleNamespace(_is_compiling_flag=False)

#: True while the current CUDA stream is captured into a CUDA graph (events cannot time it):
#: ``torch._C._cuda_isCurrentStreamCapturing``, the C function behind the public
#: ``torch.cuda.is_current_stream_capturing`` (pytorch/pytorch#77673), one frame fewer; the public
#: one where it is missing (a CPU-only build). Checked on torch 2.13.0.
cuda_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)

# --------------------------------------------------------------------------- profiler
#: ``torch.autograd.profiler``: its module global ``_is_profiler_enabled`` (read per call, as an
#: attribute of this module, since the profiler rebinds it) says whether ``record_function`` ranges
#: would land in a trace. Checked on torch 2.13.0.
profiler = torch.autograd.profiler


# --------------------------------------------------------------------------- node pre-hooks
_CARRIER = None  # not probed yet; then the carrier tensor, or False (the public route)


def hook_carrier():
    """The carrier tensor of torch's tensor-hook route for node pre-hooks, or None.

    ``Node.register_prehook`` builds an OrderedDict and a ``RemovableHandle`` in Python for every
    node (~5 us of host time each on the benchmark VM, about a tenth of the timer's cost per module
    call: bench/RESULTS.md). torch's own tensor-hook route (``Tensor.register_hook`` ends in
    ``grad_fn._register_hook_dict(tensor)``, which puts the tensor's ``_backward_hooks`` dict on
    the node as a tensor pre-hook, run just before the node) costs ~1 us: the timer sets
    ``carrier._backward_hooks = {0: hook}`` and calls ``node._register_hook_dict(carrier)``. The
    carrier is a private 0-element tensor, so no user tensor is touched. The route is checked once
    per process on a two-op graph (the hook must run exactly once, with a gradient, and leave the
    gradients as they were); where it is missing or behaves otherwise (another torch version)
    ``register_prehook`` is used. Checked on torch 2.13.0."""
    global _CARRIER
    if _CARRIER is None:
        carrier = probe_tensor_prehook_route()
        _CARRIER = False if carrier is None else carrier
    return None if _CARRIER is False else _CARRIER  # (no truth test: a 0-element tensor has none)


def put_node_prehook(node, hook, carrier) -> None:
    """Run ``hook(grad_outputs)`` just before autograd runs ``node``: through the carrier (see
    ``hook_carrier``) when given, else ``Node.register_prehook`` (public since torch 2.0). The handle
    is not kept: the hook outlives its step as an inert object (its actions list emptied)."""
    if carrier is not None:
        carrier._backward_hooks = {0: hook}
        node._register_hook_dict(carrier)
    else:
        node.register_prehook(hook)


def probe_tensor_prehook_route():
    """The carrier tensor when ``grad_fn._register_hook_dict`` behaves as described above, else None."""
    try:
        with torch.inference_mode(False), torch.enable_grad():
            carrier = torch.empty(0)
            x = torch.ones(2, requires_grad=True)
            y = x * 2
            fired = []
            carrier._backward_hooks = {0: lambda grad: fired.append(("hook", grad is not None))}
            y.grad_fn._register_hook_dict(carrier)
            (grad,) = torch.autograd.grad(y.sum() * 3, x)
            if fired != [("hook", True)] or not torch.equal(grad, torch.full((2,), 6.0)):
                return None
        return carrier
    except Exception:  # noqa: BLE001 - any failure: the public route
        return None
