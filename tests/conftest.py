"""Fixtures shared by the test modules: the repository's paths and one small measured run."""
import gc
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]

# Before any test module imports transformers or lightning: a torchvision wheel that cannot load
# against this torch is made to look absent (tests/_frameworks.py), as it is on a CPU-only install.
from _frameworks import hide_broken_torchvision  # noqa: E402

hide_broken_torchvision()
DATA_DIR = Path(__file__).resolve().parent / "data"

# One intra-op thread for the whole session, and (OMP_NUM_THREADS, set below) for the processes it starts:
# the tests' tensors are small, and where the cores are busy with other work a second OpenMP thread waits
# for a core at every parallel op. tests/measure's fast lane with both cores of a 2-core VM busy: 77 s and
# 45 s of wall time with 2 threads, 26 s and 23 s with 1 (bench/results/suite_time.md). A test that sets
# its own thread count still does.
torch.set_num_threads(1)

# Fewer cyclic-garbage collections for the session (CPython's defaults are 700, 10, 10). With torch, pandas and
# the test modules loaded, each full (generation 2) collection walks ~300k long-lived objects (~0.3 s on the 2-core
# VM), and the tests that build many objects (the AST scans of tests/house, traced graphs) set one off every few
# hundred milliseconds: ~10% of the fast lane's time went to them. A 50k-object first generation and 20x ratios
# leave a few full collections per session (tests/house + tests/predict: 23 -> 4 full collections, GC time 8.9 s
# -> 4.6 s; bench/results/fast_lane.md). Nothing here asserts on when garbage is freed; memory stays bounded
# (a young generation of 50k objects is a few MB).
gc.set_threshold(50_000, 20, 20)


@pytest.fixture(scope="session", autouse=True)
def _signals_as_a_terminal_gives_them():
    """SIGINT and SIGTERM with the dispositions a program started from a terminal has, for the session.

    Why: a shell starts a background job (``pytest ... &``, a CI step sent to the background) with SIGINT
    ignored, and the child processes the tests start inherit that. PerfCheck rightly leaves an ignored signal
    alone (perfcheck.measure.signals installs its handler only over the default one), so the tests that send a
    signal and expect the interrupted run's files and KeyboardInterrupt would fail there for the launcher's
    reason, not the code's. A signal ignored at the start gets Python's default here; restored at the end."""
    import signal

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    saved = {sig: signal.getsignal(sig) for sig in defaults}
    for sig, handler in defaults.items():
        if saved[sig] is signal.SIG_IGN:
            signal.signal(sig, handler)
    yield
    for sig, handler in saved.items():
        if handler is signal.SIG_IGN:
            signal.signal(sig, handler)


@pytest.fixture(scope="session", autouse=True)
def _empty_calibration_cache(tmp_path_factory):
    """An empty per-user calibration cache for the whole session (perfcheck.hardware.cache): a
    developer's `perfcheck calibrate` result must not change what the tests predict, nor may an
    automatic quick calibration (PERFCHECK_AUTO_CALIBRATE=0). Also puts this
    checkout first on subprocesses' PYTHONPATH and gives them one intra-op thread."""
    import os

    saved = {name: os.environ.get(name) for name in ("PERFCHECK_CACHE_DIR", "PYTHONPATH", "PERFCHECK_AUTO_CALIBRATE",
                                                     "OMP_NUM_THREADS")}
    os.environ["PERFCHECK_CACHE_DIR"] = str(tmp_path_factory.mktemp("perfcheck-cache"))
    # ...and it stays empty: no automatic quick calibration (a test that wants one turns it on)
    os.environ["PERFCHECK_AUTO_CALIBRATE"] = "0"
    # Subprocesses (training scripts, deepspeed ranks, CLI calls) import this checkout, whatever
    # perfcheck an editable install elsewhere on the machine points at.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), saved["PYTHONPATH"]) if p)
    # ...on one intra-op thread each, as this process (above)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Recorded run directories (tests/data; tests/data/run_record.py re-records them)."""
    return DATA_DIR


def train_steps(model, pc, steps: int, batch=(4, 3, 32, 32), seed: int = 0):
    """``steps`` SGD steps of ``model`` on random inputs of shape ``batch``, calling ``pc.step()`` after each."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(*batch, generator=gen)).sum().backward()
        opt.step()
        opt.zero_grad()
        pc.step()


@pytest.fixture(scope="session")
def lenet_session(tmp_path_factory):
    """A stopped PerfCheck on the LeNet example (warm-up 1, a 2-step profiler window, 3 measured
    steps) and the run directory it saved: one run to read both live and from disk."""
    from perfcheck import PerfCheck
    from perfcheck.examples.models import Net

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("lenet_run")
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=3, profile_window=(0, 1, 2), out_dir=out, sample_interval=None)
    with pc:
        train_steps(model, pc, 8)
    return pc, out
