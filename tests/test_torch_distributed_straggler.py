"""A real 2-rank gloo DDP run where rank 1 sleeps 40 ms in its forward (a planted straggler): DDP
makes both ranks' steps equally long (rank 0 waits in DDP's finalize_backward for rank 1's
gradients), so the report must find the straggler by compute time (step less collective waits),
and report rank 0's wait as communication, not as optimizer time."""
import os
import socket
import sys
import time

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))

pytestmark = pytest.mark.slow
DELAY = 0.04


class _Sleepy(nn.Module):
    def __init__(self, delay):
        super().__init__()
        self.delay, self.lin = delay, nn.Linear(32, 32)

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.lin(x)


def _worker(rank, port, out):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfcheck import PerfCheck

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(_Sleepy(DELAY if rank == 1 else 0.0), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with PerfCheck(model, warmup=1, steps=3, out_dir=out, sample_interval=None) as pc:
        for step in range(6):
            g = torch.Generator().manual_seed(10 * step + rank)
            model(torch.randn(8, 32, generator=g)).sum().backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    import torch.multiprocessing as mp

    out = str(tmp_path_factory.mktemp("straggler") / "ddp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, out), nprocs=2, join=True)
    return out


def test_report_names_the_delayed_rank_by_compute_time(run_dir):
    from perfcheck.analysis.pipeline import reconcile_run
    from perfcheck.analysis.reconcile import totals_frame
    from perfcheck.report.text import render_text

    rec = reconcile_run(run_dir).table
    t = totals_frame(rec).set_index("rank")
    # DDP equalises the steps: both ranks' steps hold the 40 ms (within 25%)
    assert t.loc[0, "meas_step_s"] > 0.75 * DELAY and t.loc[1, "meas_step_s"] > 0.75 * DELAY
    # rank 0 waited for rank 1 at the end of backward: communication, not optimizer
    assert t.loc[0, "meas_bwd_finalize_s"] > 0.6 * DELAY, t.loc[0]
    assert t.loc[0, "meas_optim_s"] < 0.25 * DELAY, t.loc[0]
    assert t.loc[1, "meas_compute_s"] > t.loc[0, "meas_compute_s"] + 0.6 * DELAY
    assert bool(t.loc[1, "straggler"]) and not bool(t.loc[0, "straggler"])
    text = render_text(rec)
    line = next(ln for ln in text.splitlines() if "STRAGGLER" in ln)
    assert line.split()[0] == "1", line


def test_layout_comparison_names_the_straggler(run_dir):
    from perfcheck.analysis.layouts import reconcile_layouts

    table = reconcile_layouts([run_dir]).set_index("rank")
    assert table.loc[1, "notes"].count("straggler") == 1 and "straggler" not in table.loc[0, "notes"]
    assert table.loc[0, "meas_wait_s"] > 0.6 * DELAY
