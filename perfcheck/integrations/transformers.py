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
``TrainingArguments(fsdp=...)`` on CPU: accelerate 1.15 runs DDP instead (no FSDP on CPU); the
callback records kind "ddp" and warns. PerfCheck's hooks only read: training is bit-identical with and without the callback (tested).
"""
from __future__ import annotations

import warnings

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError("perfcheck.integrations.transformers needs transformers (pip install transformers)") from exc

from perfcheck.integrations.callbacks import CallbackRun, RunAccess


def _ds_config(args):
    """The resolved DeepSpeed config dict the Trainer hands to accelerate, or None without DeepSpeed."""
    hf = getattr(args, "hf_deepspeed_config", None)
    cfg = getattr(hf, "config", None)
    if isinstance(cfg, dict):
        return cfg
    return None


def _accelerate_layout():
    """accelerate's ``DistributedType`` value for this process ("MULTI_CPU", "FSDP", ...), or None when
    no Accelerator state exists. The Trainer's arguments say what was asked for; this says what runs:
    accelerate 1.15 turns an FSDP plugin into ``DistributedType.FSDP`` only on accelerator devices, so a
    CPU run with ``TrainingArguments(fsdp=...)`` trains under DDP (``MULTI_CPU``) without a word."""
    try:
        from accelerate.state import AcceleratorState
    except ImportError:
        return None
    if not AcceleratorState._shared_state:  # never built: asking would build one with defaults
        return None
    kind = getattr(AcceleratorState(), "distributed_type", None)
    return str(getattr(kind, "value", kind)) if kind is not None else None


def _data_parallel(args, ds) -> bool:
    """Whether the Trainer runs plain DDP (PerfCheck then records kind "ddp" and predicts its all-reduces);
    FSDP is left to PerfCheck's own layout detection on the model. Warns when FSDP was asked for and
    accelerate runs DDP instead."""
    if ds is not None:
        return False
    layout = _accelerate_layout()
    mode = str(getattr(getattr(args, "parallel_mode", None), "value", ""))
    if layout is None:  # no accelerate state: the arguments alone
        return mode == "distributed" and not getattr(args, "fsdp", None)
    ddp = layout.startswith("MULTI_")
    if ddp and getattr(args, "fsdp", None):
        warnings.warn(f"perfcheck: TrainingArguments(fsdp=...) is set but accelerate runs DistributedType.{layout} "
                      "(DDP, parameters not sharded; accelerate applies FSDP only on accelerator devices); "
                      "recorded as kind \"ddp\"", RuntimeWarning, stacklevel=3)
    return ddp


class PerfCheckCallback(RunAccess, TrainerCallback):
    """An HF ``TrainerCallback`` that measures the training run with ``perfcheck.PerfCheck``.

    ``**perfcheck_kwargs``: PerfCheck's arguments (``out_dir`` default: a fresh folder under the
    Trainer's ``output_dir``). ``run_dir`` is the run directory once training started; ``perfcheck``
    the PerfCheck itself (``.report()`` after training)."""

    def __init__(self, **perfcheck_kwargs):
        self._run = CallbackRun("PerfCheckCallback (transformers)", perfcheck_kwargs)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        ds = _ds_config(args)
        self._run.start(model, optimizer=optimizer, default_parent=args.output_dir, ds_config=ds,
                        data_parallel=_data_parallel(args, ds))

    def on_step_end(self, args, state, control, **kwargs):
        self._run.step()

    def on_train_end(self, args, state, control, **kwargs):
        self._run.stop()
