"""The ``"perfcheck"`` block of a DeepSpeed config: its fields (``PerfcheckBlock``), their checks
(``parse_block``: unknown keys and bad values raise UserError naming the key), and reading and merging
config files (``load_config``, ``merge_configs``). Light: no torch, no DeepSpeed, so the CLI's parser
and the sweep's option checks can use it. The block's keys and what they do: ``integrations.deepspeed.api``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping, Optional

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.schema import MIN_INTERVAL_S

BLOCK_KEY = "perfcheck"


@dataclasses.dataclass(frozen=True)
class ProfilerWindow:
    enabled: bool = True
    wait: int = 0
    warmup: int = 1
    active: int = 1


@dataclasses.dataclass(frozen=True)
class PerfcheckBlock:
    """The validated ``"perfcheck"`` block of a DeepSpeed config."""

    enabled: bool = True
    warmup_steps: int = 2
    steps: int = 5
    output_dir: Optional[str] = None
    system: Optional[str] = None
    sampler_interval_s: Optional[float] = 0.1
    profiler: ProfilerWindow = ProfilerWindow()
    modules: bool = True
    comms_steps: int = 1
    overhead_pairs: int = 0
    label: Optional[str] = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def total_steps(self) -> int:
        """Optimizer steps until the run directory is complete."""
        window = self.profiler.warmup + self.profiler.active if self.profiler.enabled else 0
        return self.warmup_steps + window + self.steps + self.bare_steps

    @property
    def bare_steps(self) -> int:
        """Bare steps the run makes: one after each of the first ``overhead_pairs`` measured steps, so
        at most ``steps`` (and none without module hooks to take off)."""
        return min(self.overhead_pairs, self.steps) if self.modules else 0


def _int(value, key, minimum=0):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f'"perfcheck" block: {key} must be an integer >= {minimum}, got {value!r}')
    return value


def _bool(value, key):
    if not isinstance(value, bool):
        raise UserError(f'"perfcheck" block: {key} must be true or false, got {value!r}')
    return value


def _profiler(value) -> ProfilerWindow:
    if isinstance(value, bool):
        return ProfilerWindow(enabled=value)
    if not isinstance(value, Mapping):
        raise UserError(f'"perfcheck" block: profiler must be true, false or {{"enabled", "wait", "warmup", '
                        f'"active"}}, got {value!r}')
    known = [f.name for f in dataclasses.fields(ProfilerWindow)]
    for key in value:
        if key not in known:
            raise UserError(f'"perfcheck" block: unknown key profiler.{key!r} (known: {", ".join(known)})')
    kw = {k: (_bool(v, f"profiler.{k}") if k == "enabled" else _int(v, f"profiler.{k}", 1 if k == "active" else 0))
          for k, v in value.items()}
    return ProfilerWindow(**kw)


def parse_block(config) -> Optional[PerfcheckBlock]:
    """The ``"perfcheck"`` block of a DeepSpeed config (dict, JSON path, or the block itself when it
    has no DeepSpeed keys); None when the config has no block. Raises UserError naming a bad key."""
    cfg = load_config(config)
    if cfg is None:
        return None
    block = cfg.get(BLOCK_KEY, None) if BLOCK_KEY in cfg else None
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise UserError(f'"perfcheck" block must be an object, got {type(block).__name__}')
    known = [f.name for f in dataclasses.fields(PerfcheckBlock)]
    for key in block:
        if key not in known:
            raise UserError(f'"perfcheck" block: unknown key {key!r} (known: {", ".join(known)})')
    kw = {}
    for key, value in block.items():
        if key in ("enabled", "modules"):
            kw[key] = _bool(value, key)
        elif key in ("warmup_steps", "comms_steps", "overhead_pairs"):
            kw[key] = _int(value, key)
        elif key == "steps":
            kw[key] = _int(value, key, 1)
        elif key in ("output_dir", "system", "label"):
            if value is not None and not isinstance(value, str):
                raise UserError(f'"perfcheck" block: {key} must be a string, got {value!r}')
            kw[key] = value
        elif key == "sampler_interval_s":
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= MIN_INTERVAL_S:
                    raise UserError(f'"perfcheck" block: sampler_interval_s must be seconds >= {MIN_INTERVAL_S}, or '
                                    f'null to turn the sampler off, got {value!r}')
            kw[key] = None if value is None else float(value)
        elif key == "profiler":
            kw[key] = _profiler(value)
    parsed = PerfcheckBlock(**kw)
    if parsed.system is not None:
        load_system(parsed.system)  # a bad name or file fails here, before training starts
    return parsed


def load_config(config) -> Optional[dict]:
    if config is None:
        return None
    if isinstance(config, (str, Path)):
        try:
            return json.loads(Path(config).read_text())
        except OSError as exc:
            raise UserError(f"{config}: cannot read DeepSpeed config ({exc})") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"{config}: not valid JSON ({exc})") from None
    if isinstance(config, Mapping):
        return dict(config)
    raise UserError(f"DeepSpeed config must be a dict or a JSON path, got {type(config).__name__}")


def merge_configs(base: Mapping, overlay: Optional[Mapping]) -> dict:
    """``base`` with ``overlay`` merged in: objects merge key by key (recursively), anything else
    in the overlay replaces the base's value. Neither input is modified."""
    out = json.loads(json.dumps(dict(base)))
    for key, value in (overlay or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_configs(out[key], value)
        else:
            out[key] = json.loads(json.dumps(value))
    return out
