"""One writer per predicted number: the estimate's columns are unchanged by the refactor that gave each
``pred_*`` column a single writer, and the system spec is resolved at most once per estimate.

Refactor equivalence: ``tests/data/pred_golden.csv`` holds every numeric and label column of
``perfcheck.predict.estimate.estimate`` on the example models (``perfcheck.examples.models``), on datasheet
specs (no calibration cache is read) and on FSDP2 / DTensor TP+SP layouts in a fake process group, as computed
by the code before the refactor (commit 7bdd97e): from this checkout's root, with OLD a checkout of 7bdd97e,

    PYTHONPATH=OLD:OLD/tests DS_ACCELERATOR=cpu python3 tests/predict/test_pred_writers.py --write

This pins numbers, not a model: a change that means to move a prediction (a new roofline factor, a new host
term) regenerates the file with the same command on the new code and says so in its commit.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "pred_golden.csv"

#: (case, example, system, dtype, parallel (dp, zero stage) or None, optimizer)
CASES = (
    ("lenet-h100", "lenet", "h100-sxm", None, None, "sgd"),
    ("lenet-cpu", "lenet", "cpu", None, None, "adam"),
    ("jsc-cpu", "jsc", "cpu", None, None, "sgd"),
    ("jsc-l4-dp2-z1", "jsc", "l4", None, (2, 1), "adamw"),
    ("gpt-h100-bf16", "gpt", "h100-sxm", "bf16", None, "adamw"),
    ("gpt-a100-dp4-z3", "gpt", "a100-80gb-sxm", "bf16", (4, 3), "adam-fused"),
    ("gpt-cpu", "gpt", "cpu", None, (2, 0), "sgd_momentum"),
    # torch-native layouts on PyTorch's fake process group (2 ranks): their collectives join the estimate's
    ("fsdp2-h100", "dist:fsdp2", "h100-sxm", None, None, "adam"),
    ("tp_sp-h100", "dist:tp_sp", "h100-sxm", None, None, "sgd"),
    ("tp_sp-cpu", "dist:tp_sp", "cpu", None, None, "sgd"),
)


def _spec(name):
    from perfcheck.hardware.systems import load_system

    return load_system(name)


def _predict(case):
    from perfcheck.examples.models import EXAMPLES
    from perfcheck.parallel import ParallelConfig, ZeroStage
    from perfcheck.predict.estimate import estimate

    name, example, system, dtype, parallel, optimizer = case
    if example.startswith("dist:"):
        return _predict_layout(case)
    ex = EXAMPLES[example]
    torch.manual_seed(0)
    with torch.device("meta"):
        model = ex.build()
    inputs, _ = ex.batch(2, torch.Generator().manual_seed(0))
    par = None if parallel is None else ParallelConfig(dp=parallel[0], zero_stage=ZeroStage(parallel[1]))
    frame = estimate(model, inputs, system=_spec(system), dtype=dtype, parallel=par, optimizer=optimizer)
    frame.insert(0, "case", name)
    return frame


def _predict_layout(case):
    """A torch-native layout (tests/_torch_dist_models.py) built in a 2-rank fake process group."""
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    import _torch_dist_models as layouts
    from perfcheck.predict import distributed
    from perfcheck.predict.estimate import estimate

    name, example, system, dtype, _, optimizer = case
    layout = example.split(":", 1)[1]
    created = distributed.fake_process_group(2)
    try:
        build, shape = layouts.LAYOUTS[layout]
        model = build()
        torch.manual_seed(0)
        frame = estimate(model, (torch.randn(*shape),), system=_spec(system), dtype=dtype, optimizer=optimizer)
    finally:
        if created:
            dist.destroy_process_group()
    frame.insert(0, "case", name)
    return frame


def _all() -> pd.DataFrame:
    return pd.concat([_predict(c) for c in CASES], ignore_index=True)


def test_estimate_columns_equal_the_pre_refactor_values():
    golden = pd.read_csv(GOLDEN, keep_default_na=False, na_values=[""], dtype={"module": str})
    now = _all()
    assert list(now.columns) == list(golden.columns)
    assert now[["case", "module"]].values.tolist() == golden[["case", "module"]].values.tolist()
    for col in now.columns:
        if pd.api.types.is_numeric_dtype(golden[col]) and pd.api.types.is_numeric_dtype(now[col]):
            # the CSV keeps each float's shortest round-trip repr: equal to the last bit, a tolerance of 1e-12
            # only absorbs a summation reordered across the refactor
            np.testing.assert_allclose(now[col].to_numpy(float), golden[col].to_numpy(float), rtol=1e-12, atol=0,
                                       err_msg=col)
        else:
            got = now[col].fillna("").astype(str).tolist()
            want = golden[col].fillna("").astype(str).tolist()
            assert got == want, col


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    _all().to_csv(GOLDEN, index=False)
    print(f"wrote {GOLDEN}")


# ------------------------------------------------------------------------------ the spec, resolved once
def _count_resolutions(run):
    """``(load_system calls, spec_of calls given a name or path)`` while ``run()`` runs: counted on the
    functions' code objects (sys.setprofile), so every module that imported them by name is seen."""
    from perfcheck.hardware import systems

    counts = {"load": 0, "coerce": 0}

    def profile(frame, event, arg):
        if event != "call":
            return
        if frame.f_code is systems.load_system.__code__:
            counts["load"] += 1
        elif frame.f_code is systems.spec_of.__code__ and not isinstance(frame.f_locals.get("system"),
                                                                          systems.SystemSpec):
            counts["coerce"] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return counts["load"], counts["coerce"]


@pytest.mark.parametrize("example,system,parallel", [
    ("lenet", None, None),            # the facade resolves this machine's spec (datasheet default: empty cache)
    ("gpt", "h100-sxm", None),        # a name, resolved by the estimator's edge
    ("jsc", "l4", (2, 3)),            # ZeRO-3 communication on top
])
def test_one_estimate_resolves_its_spec_at_most_once(example, system, parallel):
    """Before the spec was passed down typed, one estimate called load_system 69 times (LeNet; GPT-small: 400),
    68 of them to re-coerce the spec it already had; now once, at the edge, and nothing below it resolves a name."""
    import perfcheck
    from perfcheck.examples.models import EXAMPLES
    from perfcheck.parallel import ParallelConfig, ZeroStage

    ex = EXAMPLES[example]
    with torch.device("meta"):
        model = ex.build()
    inputs, _ = ex.batch(2, torch.Generator().manual_seed(0))
    par = None if parallel is None else ParallelConfig(dp=parallel[0], zero_stage=ZeroStage(parallel[1]))
    loads, coerced = _count_resolutions(lambda: perfcheck.estimate(model, inputs, system=system, parallel=par))
    assert loads <= 1
    assert coerced <= 1  # the edge's own resolution of a name; none below it


# ------------------------------------------------------------------------------ one writer, found by an AST scan
#: The modules of ``perfcheck.estimate``'s path (predict/ and the layout's collectives).
_ESTIMATE_PATH = ("predict/module_estimator.py", "predict/host.py", "predict/combine.py", "predict/estimate.py",
                  "predict/distributed.py", "predict/for_run.py", "predict/layout_collectives.py")
#: column -> the one function that writes it (module, function).
_WRITERS = {"pred_fwd_s": ("predict/combine.py", "predicted_times"),
            "pred_bwd_s": ("predict/combine.py", "predicted_times"),
            "bound_fwd": ("predict/combine.py", "predicted_times"),
            "bound_bwd": ("predict/combine.py", "predicted_times"),
            "pred_optim_s": ("predict/host.py", "add_host_columns")}
#: Writers of a pred column outside the estimate: analysis' rescale of a prediction to the run's micro-batches
#: takes the collectives issued fewer times per step back out of pred_<phase>_s (a derived table, not the
#: estimate's).
_DERIVED = {("analysis/step_comm.py", "per_step_comm")}


def _column_writes(path: Path):
    """(function, column) for each ``x[<col>] = / += ...`` and ``x.loc[..., <col>] = / += ...`` in ``path``;
    an f-string column ``f"pred_{phase}_s"`` is expanded over fwd/bwd."""
    import ast

    def names(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.JoinedStr):
            parts = ["".join(p.value if isinstance(p, ast.Constant) else ph for p in node.values)
                     for ph in ("fwd", "bwd")]
            return parts
        if isinstance(node, ast.Tuple):
            return [n for e in node.elts[-1:] for n in names(e)]
        return []

    tree = ast.parse(path.read_text())
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign) else []
            for t in targets:
                for sub in ([t] if not isinstance(t, ast.Tuple) else t.elts):
                    if isinstance(sub, ast.Subscript):
                        out += [(fn.name, c) for c in names(sub.slice)]
    return out


def test_each_predicted_column_has_one_writer():
    root = Path(__file__).resolve().parents[2] / "perfcheck"
    found = {}
    for rel in _ESTIMATE_PATH:
        for fn, col in _column_writes(root / rel):
            if col in _WRITERS and (rel, fn) not in _DERIVED:
                found.setdefault(col, set()).add((rel, fn))
    assert found == {col: {w} for col, w in _WRITERS.items()}


def test_a_layout_estimate_resolves_its_spec_at_most_once():
    """The FSDP2/DTensor path too: the estimate of a TP/SP layout and the time of its collectives share one spec."""
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    import _torch_dist_models as layouts
    import perfcheck
    from perfcheck.predict import distributed

    created = distributed.fake_process_group(2)
    try:
        model = layouts.tp_sp()
        loads, coerced = _count_resolutions(lambda: perfcheck.estimate(model, (torch.randn(2, 8, 16),),
                                                                       system="h100-sxm"))
    finally:
        if created:
            dist.destroy_process_group()
    assert loads <= 1 and coerced <= 1
