"""The vector width of torch's CPU kernels on this machine: the bytes one ``at::vec::Vectorized`` register holds in
the kernel the dispatcher picks, from ``torch.backends.cpu.get_cpu_capability()``.

Why not the ISA's width: a kernel registered with ``REGISTER_DISPATCH`` (aten/src/ATen/native/DispatchStub.h: "REGISTER_DISPATCH
now dispatches an AVX512 kernel to nullptr but registers other dispatches. ALSO_REGISTER_AVX512_DISPATCH should be used
for ensuring AVX512 dispatch") runs its AVX2 build on an AVX512 machine, 256-bit vectors; the batch-norm kernels
(aten/src/ATen/native/cpu/batch_norm_kernel.cpp) are registered so. Measured on the project's AVX512 Xeon (1 thread,
process time, bench/results/cnn_backward.md): aten.native_batch_norm_backward's slow path ends at 8 fp32 elements per
channel plane, the AVX2 width, with ``ATEN_CPU_CAPABILITY`` unset and set to avx2 alike. The generic (DEFAULT)
``Vectorized`` is 32 bytes too (aten/src/ATen/cpu/vec/vec_base.h: VECTOR_WIDTH 32 outside AVX512 builds); an SVE
build's is its register (SVE128/256/512).
"""
from __future__ import annotations

import torch

#: Bytes of a ``REGISTER_DISPATCH`` kernel's ``Vectorized`` by ``get_cpu_capability()``'s answer (the SVE builds keep
#: their register width); any other answer: the generic 32.
_SVE_BYTES = {"SVE128": 16, "SVE256": 32, "SVE512": 64}
DEFAULT_VECTOR_BYTES = 32


def kernel_vector_bytes(capability: str | None = None) -> int:
    """Bytes per vector of torch's ``REGISTER_DISPATCH`` CPU kernels for ``capability`` (default: this process's
    ``torch.backends.cpu.get_cpu_capability()``): 32 on x86 (AVX512 machines run the AVX2 build) and for the
    generic build, the register width on SVE."""
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    return _SVE_BYTES.get(str(capability).upper(), DEFAULT_VECTOR_BYTES)
