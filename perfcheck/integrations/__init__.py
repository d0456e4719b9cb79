"""Integrations with training engines: DeepSpeed (``deepspeed/``), the HF Trainer, Lightning and torch.distributed."""
