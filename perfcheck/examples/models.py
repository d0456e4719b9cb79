"""Example models: LeNet (``Net``), the tiny jet-substructure MLP ``JSC_Tiny`` and a GPT-2-style ``GPT``.

``Net`` is the CIFAR-10 LeNet that DeepSpeed's CIFAR-10 example trains
(https://github.com/deepspeedai/DeepSpeedExamples/tree/master/training/cifar, the model of PyTorch's
CIFAR-10 tutorial); run with DeepSpeed's Flops Profiler (https://www.deepspeed.ai/tutorials/flops-profiler/)
it prints 62.01 K params and 5.21 MMACs per forward at batch 8. ``JSC_Tiny`` is MASE's smallest
jet-substructure classifier (https://github.com/DeepWok/mase,
``machop/chop/models/physical/jet_substructure``, after the JSC models of LogicNets, Umuroglu et al.
2020, arXiv 2004.03021): 117 params, and in-place ReLUs that break naive backward hooks.

They need no download and run on CPU. ``EXAMPLES`` names each with a factory for the model, a
batch of random inputs and a loss, so ``perfcheck run --model NAME`` and the benchmarks build
the same things.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """LeNet of DeepSpeed's CIFAR-10 example / PyTorch's CIFAR-10 tutorial: input (batch, 3, 32, 32), 62,006 params."""
    #: the "module:callable" a run records so a report can rebuild the model (predict.for_run.model_from_meta)
    perfcheck_factory = "perfcheck.examples.models:Net"

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class JSC_Tiny(nn.Module):  # noqa: N801 - MASE's class name
    """MASE's tiny jet-substructure classifier: input (batch, 16), 117 params, two in-place ReLUs.

    MASE writes ``nn.ReLU(16)`` and ``nn.ReLU(5)``: ReLU's first argument is ``inplace``, so both
    ReLUs run in place (DeepSpeed's profiler prints ``inplace=True`` for them); spelled out here."""
    perfcheck_factory = "perfcheck.examples.models:JSC_Tiny"

    def __init__(self):
        super().__init__()
        self.seq_blocks = nn.Sequential(
            nn.BatchNorm1d(16),  # 32 params
            nn.ReLU(inplace=True),
            nn.Linear(16, 5),  # 16*5 + 5 = 85 params
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.seq_blocks(x)


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention: ``F.scaled_dot_product_attention`` (use_sdpa=True, nanoGPT's
    layout: one ``c_attn`` projection to q, k, v) or ``nn.MultiheadAttention`` (use_sdpa=False)."""

    def __init__(self, n_head: int, d_model: int, seq_len: int, use_sdpa: bool, dropout: float, bias: bool):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} is not a multiple of n_head={n_head}")
        self.n_head, self.use_sdpa, self.dropout = n_head, use_sdpa, dropout
        if use_sdpa:
            self.c_attn = nn.Linear(d_model, 3 * d_model, bias=bias)
            self.c_proj = nn.Linear(d_model, d_model, bias=bias)
        else:
            self.mha = nn.MultiheadAttention(d_model, n_head, dropout=dropout, bias=bias, batch_first=True)
            mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
            self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        if not self.use_sdpa:
            return self.mha(x, x, x, attn_mask=self.causal_mask[:t, :t], need_weights=False)[0]
        q, k, v = self.c_attn(x).split(d, dim=2)
        # (b, t, d) -> (b, n_head, t, d / n_head)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, d_model: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d_model, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_head, d_model, seq_len, use_sdpa, dropout, bias):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model, bias=bias)
        self.attn = CausalSelfAttention(n_head, d_model, seq_len, use_sdpa, dropout, bias)
        self.ln_2 = nn.LayerNorm(d_model, bias=bias)
        self.mlp = MLP(d_model, dropout, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2-style decoder (nanoGPT layout); input token ids (batch, t <= seq_len), output logits
    (batch, t, vocab). ``lm_head`` shares its weight with ``wte`` (tied, as in GPT-2)."""
    perfcheck_factory = "perfcheck.examples.models:GPT"  # the defaults: GPT-2 124M (gpt_small sets its own)

    def __init__(self, n_layer: int = 12, n_head: int = 12, d_model: int = 768, vocab: int = 50257,
                 seq_len: int = 1024, use_sdpa: bool = True, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.seq_len = seq_len
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_head, d_model, seq_len, use_sdpa, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, bias=bias)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.seq_len:
            raise ValueError(f"sequence length {t} exceeds seq_len={self.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _classification_loss(out, target):
    return F.cross_entropy(out, target)


def _lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@dataclass(frozen=True)
class Example:
    """A runnable example: model factory, random batch factory, loss(output, target)."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    batch: Callable[[int, torch.Generator], tuple]  # (batch_size, generator) -> (inputs, target)
    loss: Callable
    default_batch: int


def _lenet_batch(n, g):
    return (torch.randn(n, 3, 32, 32, generator=g),), torch.randint(0, 10, (n,), generator=g)


def _jsc_batch(n, g):
    return (torch.randn(n, 16, generator=g),), torch.randint(0, 5, (n,), generator=g)


_GPT_SMALL = dict(n_layer=6, n_head=8, d_model=512, vocab=8192, seq_len=256)


def _gpt_batch(n, g):
    shape = (n, _GPT_SMALL["seq_len"])
    return (torch.randint(0, _GPT_SMALL["vocab"], shape, generator=g),), torch.randint(0, _GPT_SMALL["vocab"], shape, generator=g)


def gpt_small() -> GPT:
    """The ``gpt`` example's model: 6 layers, d=512, 8 heads, vocab 8192, seq 256."""
    model = GPT(**_GPT_SMALL)
    model.perfcheck_factory = "perfcheck.examples.models:gpt_small"
    return model


EXAMPLES = {
    "lenet": Example("lenet", "LeNet (DeepSpeed's CIFAR-10 example) on CIFAR-shaped random images (3x32x32)",
                     Net, _lenet_batch, _classification_loss, 8),
    "jsc": Example("jsc", "JSC_Tiny, MASE's jet-substructure MLP (117 params, in-place ReLUs), on 16 random features",
                   JSC_Tiny, _jsc_batch, _classification_loss, 8),
    "gpt": Example("gpt", "GPT-2-style, 6 layers, d=512, 8 heads, vocab 8192, seq 256, SDPA attention",
                   gpt_small, _gpt_batch, _lm_loss, 8),
}
