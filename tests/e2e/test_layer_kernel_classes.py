"""bench/layer_gpu.py's kernel classes on a recorded H200 table of a torchtitan block: cuDNN's fused attention and
the auxiliary kernels it launches (named ``cudnn::fusion::...`` by cuDNN) are attention, cuBLAS's nvjet kernels
gemm, ATen's elementwise and reduction kernels elementwise; the names are the profiler's, recorded on the GPU."""
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "bench" / "gpu_results" / "2026-11-27-layers" / "layers_h200_kernels.csv"


def test_recorded_kernels_fall_in_their_class():
    sys.path.insert(0, str(ROOT / "bench"))
    from layer_gpu import kernel_class

    names = pd.read_csv(TABLE)["kernel"].unique()
    classes = {n: kernel_class(n) for n in names}
    cudnn = [n for n in names if "cudnn" in n]
    assert len(cudnn) >= 4 and all(classes[n] == "attention" for n in cudnn)  # fprop, bprop and two auxiliaries
    assert all(classes[n] == "gemm" for n in names if n.startswith("nvjet_"))
    aten = [n for n in names if "at::native::" in n]
    assert aten and all(classes[n] == "elementwise" for n in aten)
