"""What one ZeRO sweep runs (``SweepOptions``, every field checked before anything starts), the stage
overlays in the package's ``configs/``, and the defaults the CLI's parser shows. Light: no torch, no
DeepSpeed (``perfcheck sweep --help`` imports it). The sweep itself: ``integrations.deepspeed.sweep``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Sequence

from perfcheck.errors import UserError
from perfcheck.integrations.deepspeed.config import load_config, parse_block

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
BASE_CONFIG = CONFIG_DIR / "base.json"
DEFAULT_STAGES = ("0", "1", "2", "3")
MODELS = ("lenet", "gpt2", "jsc")  # perfcheck.examples.train_ds.MODELS (a test checks they agree)
DEFAULT_TIMEOUT_S = 600.0
LOG_NAME = "launcher.log"


def available_stages() -> list:
    """Stage names that have an overlay in the package's configs (``stage<NAME>.json``)."""
    return sorted(p.stem[len("stage"):] for p in CONFIG_DIR.glob("stage*.json"))


def stage_overlay(stage: str) -> Path:
    path = CONFIG_DIR / f"stage{stage}.json"
    if not path.is_file():
        raise UserError(f"--stages: no stage {stage!r} (known: {', '.join(available_stages())})")
    return path


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What one sweep runs; every field is checked in ``validate()`` before anything starts."""

    stages: Sequence[str] = DEFAULT_STAGES
    model: str = "lenet"
    ranks: Optional[int] = None          # processes per node (GPUs with CUDA; default 2 on CPU, all GPUs on CUDA)
    steps: Optional[int] = None          # measured optimizer steps (the config's perfcheck.steps otherwise)
    micro_batch: Optional[int] = None
    out: str = "runs/zero_sweep"
    hostfile: Optional[str] = None
    script: Optional[str] = None         # a training script of the user's instead of perfcheck.examples.train_ds
    extra_configs: Sequence[str] = ()    # overlays merged after the stage's
    force: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    optimizer: str = "torch"             # torch: torch.optim.Adam(W); fused: DeepSpeed's FusedAdam (JIT-compiled)
    verbose: bool = False
    script_args: Sequence[str] = ()

    def validate(self) -> "SweepOptions":
        if not self.stages:
            raise UserError("--stages: give at least one stage")
        seen = set()
        for s in self.stages:
            stage_overlay(s)
            if s in seen:
                raise UserError(f"--stages: stage {s!r} given twice")
            seen.add(s)
        if self.model not in MODELS:
            raise UserError(f"--model: {self.model!r} is not one of {', '.join(MODELS)}")
        for name in ("ranks", "steps", "micro_batch"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if not (isinstance(self.timeout_s, (int, float)) and self.timeout_s > 0):
            raise UserError(f"--timeout must be seconds > 0, got {self.timeout_s!r}")
        if self.optimizer not in ("torch", "fused"):
            raise UserError(f"--optimizer must be torch or fused, got {self.optimizer!r}")
        if self.hostfile is not None and not Path(self.hostfile).is_file():
            raise UserError(f"--hostfile: {self.hostfile}: no such file")
        if self.hostfile is not None and self.ranks is not None:
            raise UserError("--ranks: give either --ranks or --hostfile (the hostfile's slots set the ranks)")
        if self.script is not None and not Path(self.script).is_file():
            raise UserError(f"--script: {self.script}: no such file")
        for extra in self.extra_configs:
            cfg = load_config(extra)  # unreadable or not JSON: a UserError naming the file
            if not isinstance(cfg, dict):
                raise UserError(f"--extra-config: {extra}: expected a JSON object")
            parse_block(cfg)
        out = Path(self.out)
        if out.exists() and not out.is_dir():
            raise UserError(f"--out: {out} exists and is not a directory")
        return self
