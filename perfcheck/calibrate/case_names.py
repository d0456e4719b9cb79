"""The kinds and labels of the calibration cases: the contract between ``cases.py`` (and ``op_classes.py``),
which write them into the measurement table (``fit.MEASUREMENT_COLUMNS``: ``kind``, ``label``), and ``fit.py``,
which reads each constant off its row. One definition each: a case renamed here is renamed on both sides.
"""
from __future__ import annotations

# ---- kinds (the ``kind`` column)
MATMUL = "matmul"            # torch.mm squares and F.linear shapes: the matrix efficiency curve
MATMUL_COLD = "matmul_cold"  # the same shapes after evicting L2 (label "l2": m = the L2 bytes evicted for)
#: Bytes the cold matmul cases stream between calls, in multiples of the L2 (an L2 is not strictly LRU).
EVICT_L2_MULTIPLE = 4
MEMORY_COLD = "memory_cold"  # memory-bound ops hot and after evicting L2 (cold_cases.py; label "l2" as above)
GEMM_ALIGN = "gemm_align"    # a GEMM with an unaligned row stride and its aligned twin
MATMUL_WIDE = "matmul_wide"  # F.linear with a wide output (an LM head), forward and backward (wide_cases.py)
MATMUL_NARROW = "matmul_narrow"  # torch.mm with a narrow output (rows of n < 128: a small convolution's pixels)
CLASSFIXED = "classfixed"  # a CPU op class's tiny call, forward and backward (op_classes.conv_fixed_cases)
COPY = "copy"                # a buffer copy per size: the bandwidth curve
VECTOR = "vector"            # an elementwise add: the vector rate
LAUNCH = "launch"            # one tiny op, and a tiny autograd chain: op_dispatch_s, launch_overhead_s
HOST = "host"                # the framework's costs (predict.host): view, chains, module call, optimizer steps
OPFIXED = "opfixed"          # each tiny op family in its own tight loop (op_fixed_s)
OPCOLD = "opcold"            # the same tiny ops one after another (op_cold_s)
MODFIXED = "modfixed"        # a standard layer's Python beyond its aten ops (module_fixed_s)
OPEFF = "opeff"              # an op efficiency class (op_classes.py)
OPROWS = "oprows"            # per-row op costs (op_classes.py)
OPRATE = "oprate"            # an elementwise op's price per FLOP, operands hot (op_classes.element_rate_cases)

# ---- labels (the ``label`` column) of the LAUNCH and HOST cases
LAUNCH_OP = "op"                       # torch.add of 1-element tensors
LAUNCH_AUTOGRAD = "autograd"           # a chain of tiny multiplies, forward and backward
HOST_VIEW = "view"                     # Tensor.t() of a 1x1 tensor
HOST_MODULE_CALL = "module call"       # an nn.Module whose forward returns its input
HOST_DEVICE_KERNEL = "device kernel"   # a tiny add queued behind torch.cuda._sleep (GPU only)
HOST_FRESH_FILL = "fresh fill"         # torch.zeros of a fresh 32 MiB buffer, per 4 KiB page (CPU only)
HOST_REUSED_FILL = "reused fill"       # zero_() of a kept 32 MiB buffer, per 4 KiB page (CPU only)
HOST_SQRT_ZERO = "sqrt zeros"          # torch.sqrt of a 256 Ki-element buffer of zeros, per element
HOST_SQRT_NORMAL = "sqrt normal"      # torch.sqrt of the same buffer of normal values, per element


def count_of(label: str) -> int:
    """The ``n`` of a label ending in ``x<n>`` (a chain's length, a case's tensors or ops), else 0."""
    tail = str(label).rsplit("x", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def chain_label(grad: bool, n: int) -> str:
    """A HOST chain of ``n`` 1-element multiplies, forward only, under autograd (``grad``) or without."""
    return f"{'autograd' if grad else 'plain'} forward x{n}"


def forward_backward_label(n: int) -> str:
    """A HOST chain of ``n`` 1-element multiplies, forward and backward."""
    return f"forward+backward x{n}"


def optim_label(line: str, n: int) -> str:
    """A HOST optimizer step + zero_grad on ``n`` 1-element tensors, line ``line`` (host_keys.OPTIM_LINES)."""
    return f"optim {line} x{n}"


#: Label prefix of the OPCOLD round-robin timed after the cold filler (op_cases.op_cold_filler_cases;
#: fit_cold.op_cold_excess prefers it to the tight round-robin on a GPU spec).
AFTER_FILLER = "round-robin after filler"

#: Label prefix of the OPCOLD round-robin of the light families, the op_fixed cases' tiny ops less the convolution
#: (op_cases.op_cold_near_cases; fit_cold.op_cold_near_excess, ``host.op_cold_near_s``).
NEAR = "round-robin near"
#: The op_fixed family the near round-robin leaves out: on a CPU its classes pay their own evicted excess
#: (perfcheck.predict.host._class_cold), and its code made most of the 14-op round-robin's excess.
NEAR_LEFT_OUT = ("convolution",)


#: Label prefix of the OPCOLD round-robin timed after evicting the last-level cache (op_cases.op_cold_far_cases;
#: fit_cold.op_cold_far_excess, ``host.op_cold_far_s``); its row's ``m`` holds the L3 bytes it evicted for.
FAR = "round-robin far"


def far_label(n: int) -> str:
    """The OPCOLD case of ``n`` tiny ops, each round timed after evicting the L3 (``op_cold_far_s``)."""
    return f"{FAR} x{n}"


#: Labels of the OPCOLD step-start pair (op_cases.step_start_cases; fit_cold.step_start_excess, ``host.step_start_s``):
#: a tiny module's call after a step of other code and an L3 eviction, and the bare op it runs after the eviction.
STEP_START = "step start module"
STEP_START_OP = "step start op"


#: Label prefix of the OPCOLD cases that time how long data stays in the L3 (op_cases.l3_residency_cases;
#: fit_cold.l3_residency, ``host.l3_residency_s``): a read of a quarter of the L3, hot, after a sleep of ``n``
#: microseconds, and after an eviction; ``m`` holds the L3 bytes.
RESIDENCY = "l3 residency"


def residency_label(wait_us: int) -> str:
    """The OPCOLD residency case read after sleeping ``wait_us`` microseconds (0: hot; -1: after an eviction)."""
    return f"{RESIDENCY} {'hot' if wait_us == 0 else 'evicted' if wait_us < 0 else f'{wait_us} us'}"


#: Label prefixes of the OPCOLD cases of light families (op_cases.op_cold_light_cases; fit_cold.op_cold_light_excess,
#: ``host.op_cold_light_s``): the families one after another, and each repeated in its own short tight run.
LIGHT = "round-robin light"
LIGHT_TIGHT = "light tight"
#: Calls of each light family in a row in the ``light tight`` case (one switch per this many ops).
LIGHT_TIGHT_RUN = 32


def light_labels(n: int) -> tuple:
    """The two OPCOLD cases of ``n`` light families: (one after another, each in a tight run)."""
    return f"{LIGHT} x{n}", f"{LIGHT_TIGHT} x{n}"


def round_robin_label(n: int, after_filler: bool = False) -> str:
    """The OPCOLD case: ``n`` tiny ops called one after another (``after_filler``: each round after the cold filler)."""
    return f"{AFTER_FILLER if after_filler else 'round-robin'} x{n}"


def near_label(n: int) -> str:
    """The OPCOLD case of ``n`` light tiny ops called one after another (``op_cold_near_s``)."""
    return f"{NEAR} x{n}"


def is_label(label: str, builder, *args) -> bool:
    """True when ``label`` is ``builder(*args, n)`` for its own ``count_of`` n (a family of labels by size)."""
    return count_of(label) > 0 and str(label) == builder(*args, count_of(label))


def gemm_align_label(aligned: bool, phase: str, m: int, k: int, n: int) -> str:
    """A GEMM_ALIGN case: the ``phase`` (fwd | bwd) of an m x k x n GEMM, its row stride aligned or not."""
    return f"{'aligned' if aligned else 'unaligned'} {phase} {m}x{k}x{n}"


def aligned_twin(label: str) -> str:
    """The aligned twin's label of an unaligned GEMM_ALIGN case."""
    return str(label).replace("unaligned ", "aligned ", 1)


def is_unaligned(label: str, phase: str) -> bool:
    """True for an unaligned GEMM_ALIGN case of ``phase``."""
    return str(label).startswith(f"unaligned {phase} ")
