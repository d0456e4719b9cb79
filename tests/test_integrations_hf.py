"""HF Trainer and accelerate with perfcheck: the real libraries, random-init tiny GPT-2, no downloads.

Each run is trained twice from the same seed, with and without PerfCheck: the parameters must be
bit-identical (PerfCheck's hooks only read), and the run directory must report (``perfcheck report``
exits 0) with the optimizer line naming AdamW, the Trainer's and accelerate's default.
"""
import json

import pytest
import torch

from _frameworks import hide_broken_torchvision

hide_broken_torchvision()
transformers = pytest.importorskip("transformers")

from perfcheck.cli import main  # noqa: E402

SEQ, N_SEQ = 16, 32


def tiny_gpt2(seed=0):
    transformers.set_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=SEQ,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 64, (N_SEQ, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(tmp_path, name, callbacks, accum=1, steps=6):
    model = tiny_gpt2()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / name), per_device_train_batch_size=4, gradient_accumulation_steps=accum,
        max_steps=steps, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        dataloader_num_workers=0, seed=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=callbacks)
    trainer.train()
    return model


def report(run_dir, capsys):
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("accum", [1, 2])
def test_trainer_callback_bit_identical_and_reportable(tmp_path, capsys, accum):
    from perfcheck.integrations.transformers import PerfCheckCallback

    plain = train(tmp_path, "plain", [], accum)
    cb = PerfCheckCallback(system="cpu", sample_interval=None)
    measured = train(tmp_path, "measured", [cb], accum)
    for (name, a), b in zip(plain.named_parameters(), measured.parameters()):
        assert torch.equal(a, b), name
    assert cb.run_dir.parent == tmp_path / "measured"  # the default: under the Trainer's output_dir
    meta = json.loads((cb.run_dir / "rank0" / "meta.json").read_text())
    assert meta["optimizer"].startswith("adamw") and meta["complete"]  # Trainer 5: adamw_torch_fused
    assert meta["micro_batches"] == accum  # gradient accumulation: root forwards per optimizer step
    assert meta["model"]["type"] == "GPT2LMHeadModel"
    out = report(cb.run_dir, capsys)
    assert f"optimizer {meta['optimizer']}:" in out


def test_accelerate_recipe(tmp_path, capsys):
    """The README's accelerate recipe: PerfCheck on the unwrapped model, step() after optimizer.step()."""
    accelerate = pytest.importorskip("accelerate")
    from perfcheck import PerfCheck

    def run(measure):
        model = tiny_gpt2()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.utils.data.DataLoader(Tokens(), batch_size=4)
        acc = accelerate.Accelerator(cpu=True)
        model, opt, data = acc.prepare(model, opt, data)
        pc = PerfCheck(acc.unwrap_model(model), out_dir=tmp_path / "acc", system="cpu",
                       sample_interval=None).start() if measure else None
        for batch in data:
            loss = model(**batch).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            if pc is not None:
                pc.step()
        if pc is not None:
            pc.stop()
        return acc.unwrap_model(model)

    plain, measured = run(False), run(True)
    for (name, a), b in zip(plain.named_parameters(), measured.parameters()):
        assert torch.equal(a, b), name
    meta = json.loads((tmp_path / "acc" / "rank0" / "meta.json").read_text())
    assert meta["optimizer"] == "adamw"
    assert "optimizer adamw:" in report(tmp_path / "acc", capsys)
