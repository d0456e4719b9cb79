"""``perfcheck.deepspeed.initialize(...)``: drop-in for ``deepspeed.initialize`` (see
``perfcheck.integrations.deepspeed.api``). DeepSpeed itself is imported only when a function runs."""
from perfcheck.integrations.deepspeed.api import attach, attach_engine, initialize, save_prediction  # noqa: F401
from perfcheck.integrations.deepspeed.config import BLOCK_KEY, PerfcheckBlock, parse_block  # noqa: F401
from perfcheck.integrations.deepspeed.block import perfcheck_for_engine  # noqa: F401

__all__ = ["BLOCK_KEY", "PerfcheckBlock", "attach", "attach_engine", "initialize", "parse_block", "perfcheck_for_engine",
           "save_prediction"]
