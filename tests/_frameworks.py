"""Shared by the framework-integration tests (HF Trainer, accelerate, Lightning): an import guard.

This environment's torchvision wheel does not match its CPU torch (importing it raises
"operator torchvision::nms does not exist"), and transformers imports torchvision whenever it is
installed, as does Lightning's torchmetrics. ``hide_broken_torchvision()`` makes a torchvision that
cannot be imported look absent, in this process only: ``sys.modules["torchvision"] = None``
(``importlib.util.find_spec`` then returns None: transformers' check) and lightning_utilities'
version lookup answering PackageNotFoundError for it (torchmetrics' ``RequirementCache``). A
working or absent torchvision is left alone. The subprocess scripts call it too.
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
        _hide_from_lightning_utilities()


def _hide_from_lightning_utilities():
    try:
        from lightning_utilities.core import imports
    except ImportError:
        return
    from importlib.metadata import PackageNotFoundError

    version = imports._version

    def _version(name):
        if name == "torchvision":
            raise PackageNotFoundError(name)
        return version(name)

    imports._version = _version
