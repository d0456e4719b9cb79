"""Shared by the framework-integration tests (HF Trainer, accelerate, Lightning): an import guard.

This environment's torchvision wheel does not match its CPU torch (importing it raises
"operator torchvision::nms does not exist"), and transformers imports torchvision whenever it is
installed. ``hide_broken_torchvision()`` makes a torchvision that cannot be imported look absent
(``sys.modules["torchvision"] = None``: ``importlib.util.find_spec`` then returns None), in this
process only; a working torchvision is left alone. The subprocess scripts call it too.
"""
import os
import sys


def hide_broken_torchvision():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure: treat as not installed
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision"] = None
