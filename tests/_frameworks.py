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
        _forget_transformers_checks()


def _forget_transformers_checks():
    """transformers caches its availability checks (lru_cache): drop them if it was imported first."""
    utils = sys.modules.get("transformers.utils.import_utils")
    for name in ("_is_package_available", "is_torchvision_available", "is_torchvision_v2_available",
                 "is_vision_available"):
        clear = getattr(getattr(utils, name, None), "cache_clear", None)
        if clear is not None:
            clear()


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


# ---------------------------------------------------------------------------- tiny HF models, no downloads
SEQ, N_SEQ, VOCAB = 16, 32, 64


def tiny_gpt2(seed=0):
    """A random-init 2-layer GPT-2 (32 wide, vocabulary 64), dropout off."""
    import transformers

    transformers.set_seed(seed)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def tokens():
    """N_SEQ random sequences of SEQ token ids, as a Dataset of {input_ids, labels}."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (N_SEQ, SEQ), generator=g)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids)

        def __getitem__(self, i):
            return {"input_ids": ids[i], "labels": ids[i]}

    return Tokens()


def training_args(output_dir, accum=1, steps=6, **extra):
    import transformers

    return transformers.TrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=4, gradient_accumulation_steps=accum,
        max_steps=steps, use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
        dataloader_num_workers=0, seed=0, disable_tqdm=True, **extra)
