"""DeepSpeed's optimizer step as its code runs it (``predict.deepspeed_step``), checked op by op against
DeepSpeed 0.19.8's own ``engine.step()`` on CPU: every aten op the step dispatches outside the inner optimizer's
update (amax/amin, the fp64 norm's copy, cat, the casts, mul_, the copy back), its tensors' bytes read and written,
per element of the rank's partition, equal the formula's passes less its ``update``. The wrapper is the same Python
code on a GPU; there FusedAdam runs the update (priced by hand in test_optimizer_passes.py)."""
import json
import subprocess
import sys
import textwrap

import pytest

from perfcheck.predict import deepspeed_step, zero

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.deepspeed, pytest.mark.slow]

#: (ZeRO stage, dtype, gradient_clipping): 16-bit stage 0 runs FP16_UnfusedOptimizer on CPU (no FusedAdam), not the
#: FP16_Optimizer a GPU builds, so it is read from the code instead (test_optimizer_passes.py)
CASES = [(1, "bf16", 1.0), (2, "bf16", 0.0), (3, "bf16", 1.0), (3, "bf16", 0.0), (1, "fp32", 1.0), (2, "fp32", 0.0),
         (0, "fp32", 1.0), (0, "fp32", 0.0)]

SCRIPT = textwrap.dedent('''
    import json, os, socket, sys
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      DS_ACCELERATOR="cpu")
    import torch, deepspeed
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from perfcheck.examples.train_ds import _no_shm_comm_build

    class Bytes(TorchDispatchMode):
        """Bytes each data-moving aten op reads and writes (tensors of more than 64 elements: not the scalars)."""
        def __init__(self):
            super().__init__(); self.total, self.paused = 0, False
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self.paused or getattr(func, "is_view", False) or func.__name__.startswith("detach"):
                return out
            big = lambda ts: [t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor) and t.numel() > 64]
            ins, outs = big(tree_leaves((args, kwargs))), big(tree_leaves(out))
            name = func.__name__
            if name.startswith("copy_"):          # dst written, src read
                self.total += sum(ins[:2])
            elif name.split(".")[0].endswith("_"):  # in place: self read and written, the others read
                self.total += (2 * ins[0] + sum(ins[1:])) if ins else 0
            else:
                self.total += sum(ins) + sum(outs)
            return out

    _no_shm_comm_build()
    deepspeed.init_distributed(dist_backend="gloo")
    result = []
    for stage, dtype, clip in json.loads(sys.argv[1]):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": clip,
               "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
               "zero_optimization": {"stage": stage}}
        if dtype == "bf16":
            cfg["bf16"] = {"enabled": True}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        rec, update = Bytes(), inner.step
        def paused(*a, **k):
            rec.paused = True
            try:
                return update(*a, **k)
            finally:
                rec.paused = False
        inner.step = paused
        for i in range(3):
            x = torch.randn(4, 256, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
            engine.backward(engine(x).float().pow(2).mean())
            if i < 2:
                engine.step()
            else:
                with rec:
                    engine.step()
        params = sum(p.numel() for p in model.parameters())
        result.append(dict(stage=stage, dtype=dtype, clip=clip, per_param=rec.total / params,
                           wrapper=type(engine.optimizer).__name__))
    print("RESULT " + json.dumps(result))
''')


@pytest.fixture(scope="module")
def traced():
    run = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES)], capture_output=True, text=True,
                         timeout=600)
    line = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, run.stderr[-3000:]
    return {(r["stage"], r["dtype"], r["clip"]): r for r in json.loads(line[0][len("RESULT "):])}


@pytest.mark.parametrize("stage, dtype, clip", CASES)
def test_the_wrapper_passes_are_the_ones_deepspeed_runs(traced, stage, dtype, clip):
    r = traced[(stage, dtype, clip)]
    prec = zero.precision(dtype, "adam", stage=stage)
    passes = deepspeed_step.passes(stage, prec, loss_scaling=False, clip=clip > 0)
    around_the_update = float(sum(v for k, v in passes.items() if k != "update"))
    assert r["per_param"] == pytest.approx(around_the_update, abs=0.05), (r, passes)
