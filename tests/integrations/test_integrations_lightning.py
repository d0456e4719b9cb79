"""Lightning with perfcheck: a LightningModule whose training_step calls a submodule (not forward).

Trained twice from the same seed, with and without the callback: parameters bit-identical; the
callback times the submodule training_step calls (found at the first batch) and the run directory
reports with the optimizer line naming AdamW.
"""
import json

import pytest
import torch

from _frameworks import hide_broken_torchvision

hide_broken_torchvision()
L = pytest.importorskip("lightning.pytorch")

from perfcheck.commands.cli import main  # noqa: E402


class Lit(L.LightningModule):
    """training_step calls self.net and a parameter-free loss module; forward is never called."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        self.loss = torch.nn.MSELoss()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def data():
    g = torch.Generator().manual_seed(3)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g))
    return torch.utils.data.DataLoader(ds, batch_size=8)


def fit(tmp_path, callbacks, accum=1):
    L.seed_everything(0, verbose=False)
    module = Lit()
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, accumulate_grad_batches=accum, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), callbacks=callbacks)
    trainer.fit(module, data())
    return module


@pytest.mark.parametrize("accum", [1, 2])
def test_lightning_callback_times_the_submodule(tmp_path, capsys, accum):
    from perfcheck.integrations.lightning import PerfCheckCallback

    plain = fit(tmp_path / "plain", [], accum)
    cb = PerfCheckCallback(system="cpu", sample_interval=None)
    with pytest.warns(RuntimeWarning, match=r"several modules \(net, loss\); measuring 'net'"):
        measured = fit(tmp_path / "measured", [cb], accum)
    for (name, a), b in zip(plain.named_parameters(), measured.parameters()):
        assert torch.equal(a, b), name
    assert cb.measured_path == "net" and cb.run_dir.parent == tmp_path / "measured"
    meta = json.loads((cb.run_dir / "rank0" / "meta.json").read_text())
    assert meta["model"]["type"] == "Sequential" and meta["optimizer"] == "adamw-for-loop" and meta["complete"]
    assert meta["micro_batches"] == accum
    capsys.readouterr()
    assert main(["report", str(cb.run_dir)]) == 0
    out = capsys.readouterr().out
    assert "optimizer adamw-for-loop:" in out


def test_root_never_called_is_said_at_the_first_step():
    """PerfCheck on the LightningModule itself (the mistake the callback avoids): warned at step one."""
    from perfcheck import PerfCheck

    module = Lit()
    opt = module.configure_optimizers()
    x, y = torch.randn(4, 16), torch.randn(4, 4)
    with pytest.warns(RuntimeWarning, match=r"root module \(Lit\) was never called.*outermost modules that ran: "
                                            r"net \(Sequential\), loss \(MSELoss\)"):
        with PerfCheck(module, warmup=0, steps=2, profile=False, sample_interval=None) as pc:
            module.training_step((x, y), 0).backward()
            opt.step()
            pc.step()


@pytest.mark.filterwarnings("ignore:perfcheck. training_step calls several modules")
def test_deepspeed_strategy_config_block_reaches_the_run(tmp_path, capsys):
    """Lightning's DeepSpeedStrategy needs CUDA to fit, so its callback path is driven here by hand: the real
    ``lightning.pytorch.strategies.DeepSpeedStrategy`` (built, never set up: its ``__init__`` stores the
    config dict as ``.config``, lightning 2.6.6 strategies/deepspeed.py) on a stand-in trainer, the hooks
    called in Lightning's order (``global_step`` moves before ``on_train_batch_end``). The config's
    "perfcheck" block must set where the run goes and how many steps it measures; ZeRO-2 is recorded."""
    pytest.importorskip("deepspeed")
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DeepSpeedStrategy

    from perfcheck.integrations.lightning import PerfCheckCallback

    out_dir = tmp_path / "from-block"
    strategy = DeepSpeedStrategy(config={
        "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
        "perfcheck": {"enabled": True, "output_dir": str(out_dir), "warmup_steps": 1, "steps": 3, "system": "cpu",
                      "sampler_interval_s": None, "profiler": {"enabled": False}}})
    assert strategy.config["perfcheck"]["output_dir"] == str(out_dir)  # the attribute the callback reads
    module = Lit()
    opt = module.configure_optimizers()
    trainer = SimpleNamespace(strategy=strategy, optimizers=[opt], default_root_dir=str(tmp_path / "root"),
                              global_step=0)
    cb = PerfCheckCallback()
    cb.on_train_start(trainer, module)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    with pytest.warns(RuntimeWarning, match=r"\"perfcheck\" block is honoured by PerfCheckCallback \(lightning\)"):
        for i in range(7):
            cb.on_train_batch_start(trainer, module, (x, y), i)
            module.training_step((x, y), i).backward()
            opt.step()
            opt.zero_grad()
            trainer.global_step += 1
            cb.on_train_batch_end(trainer, module, None, (x, y), i)
    cb.on_train_end(trainer, module)
    assert cb.run_dir == out_dir and not (tmp_path / "root").exists()
    meta = json.loads((out_dir / "rank0" / "meta.json").read_text())
    assert meta["options"]["steps"] == 3 and meta["options"]["warmup"] == 1 and meta["measured_steps"] == 3
    assert meta["parallel"]["kind"] == "deepspeed" and meta["parallel"]["zero_stage"] == 2
    assert meta["optimizer"] == "adamw-for-loop" and meta["system"] == "cpu" and meta["complete"]
    capsys.readouterr()
    assert main(["report", str(out_dir)]) == 0
