"""Integrations with training engines: ``deepspeed/`` (config block, engine wrapper, ZeRO facts)."""
