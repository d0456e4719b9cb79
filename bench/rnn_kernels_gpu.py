"""The kernels one training step of the held-out recurrent models runs on a GPU, with their device times.

Why (issue 26): on an H200 the held-out LSTM language model read measured/predicted 1.97 and the GRU 0.99 (fp32,
cuDNN's ``_cudnn_rnn``), after reading 0.47 and 0.16 before the fp32 size-curve fix: the recurrent cost
(``formulas.rnn``) needs the kernel count and per-kernel time cuDNN really spends per time step. One warm step
of each model (bench/heldout.py's builds) under torch.profiler: per kernel name, calls and device seconds.

    python bench/rnn_kernels_gpu.py --csv rnn_kernels.csv      # on the GPU machine
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402
from heldout_gpu import to_device  # noqa: E402


def one_step(w, opt):
    out = w.model(*w.inputs)
    loss = w.loss(out, w.target)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="lstm_lm,gru_rmsprop")
    ap.add_argument("--csv", default="rnn_kernels.csv")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        w = to_device(heldout.build(name), torch.device("cuda"))
        opt = w.optimizer(w.model.parameters())
        for _ in range(3):
            one_step(w, opt)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            one_step(w, opt)
            torch.cuda.synchronize()
        for ev in prof.key_averages():
            t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if t > 0:
                rows.append(dict(model=name, kernel=ev.key[:160], calls=ev.count, seconds=t / 1e6))
        df = pd.DataFrame([r for r in rows if r["model"] == name]).sort_values("seconds", ascending=False)
        print(f"RNN {name}: {len(df)} kernel names, {df.calls.sum()} launches, {df.seconds.sum() * 1e3:.3f} ms device")
        for _, r in df.head(12).iterrows():
            print(f"RNN {name} | {r.calls:5d} | {r.seconds * 1e6:9.1f} us | {r.kernel[:110]}")
    pd.DataFrame(rows).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
