"""A real 2-rank gloo DDP run where rank 1 sleeps 150 ms in its forward (a planted straggler): DDP
makes both ranks' steps equally long (rank 0 waits in DDP's finalize_backward for rank 1's
gradients), so the report must find the straggler by compute time (step less collective waits),
and report rank 0's wait as communication, not as optimizer time.

In the same processes, FSDP2 runs with forward prefetch (each block all-gathers the next one's
parameters in its own pre-forward) where rank 1 sleeps 150 ms in block 0's forward, after block 0's
pre-forward issued layers.1's all-gather: rank 0 issues layers.2's all-gather in layers.1's
forward and waits for rank 1's matching one. With FSDP2's default synchronous unshard (gloo), the
issuing call blocks: the wait is in layers.1's forward; with an asynchronous unshard
(``unshard_async_op``, as on a GPU's all-gather stream) it moves to layers.2's forward, where the
gathered parameters are copied out. The reconciled table must put the bytes on the issuer and
the wait on the module that waited."""
import os
import socket
import sys
import time

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers

# slow (two processes), and timing: upper bounds on wall-clock phases (optimizer, non-root waits) as
# fractions of the planted delay
pytestmark = [pytest.mark.slow, pytest.mark.timing]
# 150 ms, not 40: the assertions are fractions of it, and on a 2-core machine with both cores busy the two
# ranks' own scheduling made a 104 ms wait in an unplanted reduce-scatter (bench/results/timing-tests.md),
# which a 40 ms straggler did not outweigh
DELAY = 0.15


class _Sleepy(nn.Module):
    def __init__(self, delay):
        super().__init__()
        self.delay, self.lin = delay, nn.Linear(32, 32)

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.lin(x)


class _Block(nn.Module):
    def __init__(self, delay=0.0):
        super().__init__()
        self.lin = _Sleepy(delay)

    def forward(self, x):
        return torch.relu(self.lin(x))


class _Blocks(nn.Module):
    """Four 32x32 blocks and a head: FSDP2 units layers.0-3 (1056 parameters, 4224 B each) and the root."""

    def __init__(self, delay=0.0):
        super().__init__()
        self.layers = nn.ModuleList([_Block(delay)] + [_Block() for _ in range(3)])
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _train(model, out, rank):
    from perfcheck import PerfCheck

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with PerfCheck(model, warmup=1, steps=3, out_dir=out, sample_interval=None) as pc:
        for step in range(6):
            g = torch.Generator().manual_seed(10 * step + rank)
            model(torch.randn(8, 32, generator=g)).sum().backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    # the live table (PerfCheck.collectives(), not collectives.csv) for the one-assembly-path check
    pc.reconciled().to_pickle(os.path.join(out, f"live{rank}.pkl"))


def _worker(rank, port, out):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    _train(DDP(nn.Sequential(_Sleepy(DELAY if rank == 1 else 0.0), nn.ReLU(), nn.Linear(32, 4))),
           os.path.join(out, "ddp"), rank)
    for asynchronous in (False, True):
        torch.manual_seed(0)
        model = _Blocks(DELAY if rank == 1 else 0.0)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        for a, b in zip(model.layers[:-1], model.layers[1:]):
            a.set_modules_to_forward_prefetch([b])
        for layer in model.layers:
            layer._get_fsdp_state()._fsdp_param_group.unshard_async_op = asynchronous
        _train(model, os.path.join(out, "fsdp2_async" if asynchronous else "fsdp2"), rank)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    import torch.multiprocessing as mp

    out = str(tmp_path_factory.mktemp("straggler"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, out), nprocs=2, join=True)
    return out


@pytest.fixture(scope="module")
def run_dir(runs_dir):
    return os.path.join(runs_dir, "ddp")


def test_report_names_the_delayed_rank_by_compute_time(run_dir):
    from perfcheck.analysis.pipeline import reconcile_run
    from perfcheck.analysis.totals import totals_frame
    from perfcheck.report.text import render_text

    rec = reconcile_run(run_dir).table
    t = totals_frame(rec).set_index("rank")
    # DDP equalises the steps: both ranks' steps hold the planted DELAY (within 25%)
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


# ------------------------------------------------------------- collectives per module: issued vs waited
def _issued(run, rank):
    """Issued rows of the rank's collectives.csv and the profiled steps they span (from meta.json)."""
    import json

    import pandas as pd

    coll = pd.read_csv(os.path.join(run, f"rank{rank}", "collectives.csv"))
    meta = json.load(open(os.path.join(run, f"rank{rank}", "meta.json")))
    return coll[coll["what"] == "issued"], len(meta["profile"]["steps"])


def test_ddp_bucket_bytes_on_the_issuers_and_the_wait_on_the_root(run_dir):
    from perfcheck.analysis.findings import findings_table
    from perfcheck.analysis.pipeline import reconcile_run

    rec = reconcile_run(run_dir).table
    # 4 x parameters: Linear(32, 32) 1056 + Linear(32, 4) 132 = 1188 floats = 4752 B all-reduced per step
    for rank in (0, 1):
        part = rec[rec["rank"] == rank].set_index("module")
        assert part.loc["(root)", "meas_comm_bwd_bytes"] == 4752, part["meas_comm_bwd_bytes"]
        assert part.loc["(root)", "comm_bwd_bytes"] == 4752  # the prediction from DDP's buckets
        # every byte sits on some module that issued it, and they add up to collectives.csv's total
        issued, steps = _issued(run_dir, rank)
        assert part["meas_comm_own_bwd_bytes"].sum() == issued["bytes"].sum() / steps == 4752
        assert part["meas_comm_own_fwd_bytes"].sum() == 0
    r0 = rec[rec["rank"] == 0].set_index("module")
    # rank 0 waited for rank 1's DELAY at the end of backward: on the root, not on the issuers
    assert r0.loc["(root)", "meas_comm_wait_own_bwd_s"] > 0.6 * DELAY, r0["meas_comm_wait_own_bwd_s"]
    assert r0.drop("(root)")["meas_comm_wait_own_bwd_s"].max() < 0.1 * DELAY
    f = findings_table(rec)
    f = f[(f["reason"] == "comm_wait") & (f["rank"] == 0)]
    assert list(f["module"]) == ["(root)"], f
    ev = f["evidence"].iloc[0]
    assert "DDP bucket all-reduce" in ev and "4.75 KB" in ev and "waited on at the end of backward" in ev, ev
    assert f["lost_s"].iloc[0] > 0.6 * DELAY


@pytest.mark.parametrize("variant", ["fsdp2", "fsdp2_async"])
def test_fsdp2_prefetched_all_gather_bytes_on_the_issuer_wait_on_the_waiter(runs_dir, variant):
    from perfcheck.analysis.findings import findings_table
    from perfcheck.analysis.pipeline import reconcile_run
    from perfcheck.analysis.totals import totals_frame
    from perfcheck.report.text import render_text

    run = os.path.join(runs_dir, variant)
    rec = reconcile_run(run).table
    r0 = rec[rec["rank"] == 0].set_index("module")
    unit = (32 * 32 + 32) * 4  # one block's all-gather output: 1056 floats
    # layers.1's pre-forward prefetches layers.2: its own forward issued exactly that all-gather
    assert r0.loc["layers.1", "meas_comm_own_fwd_bytes"] == unit
    assert r0.loc["layers.2", "meas_comm_own_fwd_bytes"] == unit  # and layers.2's prefetches layers.3
    # synchronous: the issuing call in layers.1 blocks; asynchronous: layers.2 waits where it copies out
    waiter, other = ("layers.1", "layers.2") if variant == "fsdp2" else ("layers.2", "layers.1")
    waits = r0["meas_comm_wait_own_fwd_s"]
    assert waits[waiter] > 0.6 * DELAY, waits
    assert waits[waiter] - waits[other] > 0.5 * DELAY, waits  # the planted DELAY is on one of them only
    assert r0.loc["(root)", "meas_comm_wait_fwd_s"] >= waits[waiter] + waits["(root)"]  # the subtree holds it too
    text = r0.loc[waiter, "comm_waits_fwd"]
    expect = ("FSDP2 all-gather for layers.2 (prefetch) (4.22 KB) issued and waited on in layers.1's forward "
              "(a synchronous call" if variant == "fsdp2" else
              "FSDP2 all-gather for layers.2 (4.22 KB) issued in layers.1's forward (prefetch), waited on in "
              "layers.2's forward")
    assert expect in text, text
    # every rank: per phase, the bytes on the issuers add up to collectives.csv's total and to the root's
    for rank in (0, 1):
        part = rec[rec["rank"] == rank].set_index("module")
        issued, steps = _issued(run, rank)
        for p in ("fwd", "bwd"):
            total = issued.loc[issued["phase"] == p, "bytes"].sum() / steps
            assert part[f"meas_comm_own_{p}_bytes"].sum() == total == part.loc["(root)", f"meas_comm_{p}_bytes"]
        # 4 blocks + the root's head (132 floats) gathered in forward: measured = predicted
        assert part.loc["(root)", "meas_comm_fwd_bytes"] == part.loc["(root)", "comm_fwd_bytes"] == 4 * unit + 132 * 4
    f = findings_table(rec)
    # the largest forward wait finding of rank 0 is the planted one, on the waiter (under load other
    # synchronous all-gathers can pass the 5% too: they are findings of their own)
    f = f[(f["reason"] == "comm_wait") & (f["rank"] == 0) & (f["phase"] == "fwd")].sort_values("lost_s")
    assert f["module"].iloc[-1] == waiter and expect in f["evidence"].iloc[-1], f
    assert expect in render_text(rec, rank=0)
    # the totals count the waits inside forward (not only the end-of-backward ones) for rank 0. Which rank is
    # the straggler is not asserted here: the in-step waits come from the one profiled step, whose backward
    # on this shared 2-core machine sometimes had rank 0 the slower (rank 1 then waited 60 ms in its
    # reduce-scatters); the rule itself is tested on hand-built rows in test_analysis_comm.py
    t = totals_frame(rec).set_index("rank")
    assert t.loc[0, "meas_comm_wait_s"] > t.loc[0, "meas_bwd_finalize_s"], t[["meas_comm_wait_s", "meas_bwd_finalize_s"]]


@pytest.mark.parametrize("variant", ["ddp", "fsdp2"])
def test_live_and_saved_collective_columns_are_the_same(runs_dir, variant):
    """PerfCheck.reconciled() reads the live window's collectives, reconcile_run the saved collectives.csv:
    one assembly path, the same per-module communication columns."""
    import pandas as pd

    from perfcheck.analysis.pipeline import reconcile_run
    from perfcheck.schema import MODULE_COMM_COLUMNS

    run = os.path.join(runs_dir, variant)
    saved = reconcile_run(run).table
    cols = ["module"] + [c.format(p=p) for p in ("fwd", "bwd") for c in MODULE_COMM_COLUMNS]
    for rank in (0, 1):
        live = pd.read_pickle(os.path.join(run, f"live{rank}.pkl"))
        pd.testing.assert_frame_equal(live[cols].reset_index(drop=True),
                                      saved.loc[saved["rank"] == rank, cols].reset_index(drop=True))
        assert (live["meas_comm_bwd_bytes"] > 0).any()


def test_layout_comparison_says_where_each_run_waits(runs_dir):
    from perfcheck.analysis.layouts import answers, reconcile_layouts

    table = reconcile_layouts([os.path.join(runs_dir, v) for v in ("ddp", "fsdp2_async")])
    said = dict(answers(table))
    ddp = said["Where does ddp wait longest on a collective?"]
    assert ddp.startswith("rank 0: DDP bucket all-reduce (1 per step, 4.75 KB)") and "end of backward" in ddp, ddp
    fsdp = said["Where does fsdp2_async wait longest on a collective?"]
    assert fsdp.startswith("rank 0: FSDP2 all-gather for layers.2 (4.22 KB) issued in layers.1's forward (prefetch), "
                           "waited on in layers.2's forward"), fsdp
    assert (table.loc[table["rank"] == 0, "top_wait_s"] > 0.6 * DELAY).all()
