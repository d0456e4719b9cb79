"""PerfCheck in an HF ``transformers.Trainer``: one line, a reportable run directory.

    from perfcheck.integrations.transformers import PerfCheckCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[PerfCheckCallback()])
    trainer.train()                     # -> <output_dir>/<date>-perfcheck-<id>/rank<R>/...; perfcheck report it

The callback takes PerfCheck's keyword arguments (``warmup``, ``steps``, ``out_dir``, ``system``,
...). It starts PerfCheck on ``on_train_begin`` with the model whose forward the Trainer calls
(the unwrapped model; DDP and DeepSpeed call its forward) and the Trainer's optimizer (AdamW by
default; accelerate's wrapper unwrapped), steps it on ``on_step_end`` (once per optimizer step, so
gradient accumulation shows as ``micro_batches``) and stops it on ``on_train_end``, which writes
the run directory. Under DDP (``torchrun``) every rank writes ``rank<R>/`` of the same directory
(named on rank 0); with ``TrainingArguments(deepspeed=...)`` the config's ``"perfcheck"`` block sets
PerfCheck's arguments (``integrations.deepspeed.block``) and the ZeRO stage goes into meta.json.
PerfCheck's hooks only read: training is bit-identical with and without the callback (tested).
"""
from __future__ import annotations

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError("perfcheck.integrations.transformers needs transformers (pip install transformers)") from exc

from perfcheck.integrations.callbacks import CallbackRun


def _ds_config(args):
    """The resolved DeepSpeed config dict the Trainer hands to accelerate, or None without DeepSpeed."""
    hf = getattr(args, "hf_deepspeed_config", None)
    cfg = getattr(hf, "config", None)
    if isinstance(cfg, dict):
        return cfg
    return None


class PerfCheckCallback(TrainerCallback):
    """An HF ``TrainerCallback`` that measures the training run with ``perfcheck.PerfCheck``.

    ``**perfcheck_kwargs``: PerfCheck's arguments (``out_dir`` default: a fresh folder under the
    Trainer's ``output_dir``). ``run_dir`` is the run directory once training started; ``perfcheck``
    the PerfCheck itself (``.report()`` after training)."""

    def __init__(self, **perfcheck_kwargs):
        self._run = CallbackRun("PerfCheckCallback (transformers)", perfcheck_kwargs)

    @property
    def run_dir(self):
        return self._run.run_dir

    @property
    def perfcheck(self):
        return self._run.pc

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        ds = _ds_config(args)
        mode = str(getattr(getattr(args, "parallel_mode", None), "value", ""))
        self._run.start(model, optimizer=optimizer, default_parent=args.output_dir, ds_config=ds,
                        data_parallel=ds is None and mode == "distributed" and not getattr(args, "fsdp", None))

    def on_step_end(self, args, state, control, **kwargs):
        self._run.step()

    def on_train_end(self, args, state, control, **kwargs):
        self._run.stop()
