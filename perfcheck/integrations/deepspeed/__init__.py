"""DeepSpeed: the config's "perfcheck" block, the engine wrapper and the ZeRO sweep.

The config's ``"perfcheck"`` block and the drop-in ``initialize`` (``api``),
the engine wrapper that measures (``engine_session``), the comms logger's records (``comms``), the
engine's ZeRO facts (``facts``), and the ZeRO sweep's stage configs (``configs/*.json``, package data)."""
