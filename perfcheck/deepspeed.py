"""``perfcheck.deepspeed.initialize(...)``: drop-in for ``deepspeed.initialize`` (see
``perfcheck.integrations.deepspeed``). DeepSpeed itself is imported only when a function runs."""
from perfcheck.integrations.deepspeed import (BLOCK_KEY, PerfcheckBlock, attach_engine, initialize,  # noqa: F401
                                              parse_block, save_prediction)

__all__ = ["BLOCK_KEY", "PerfcheckBlock", "attach_engine", "initialize", "parse_block", "save_prediction"]
