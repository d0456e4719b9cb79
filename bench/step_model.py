"""A training step's model and loss as one module, so the benchmarks predict the loss where a step runs it.

Why: the measured forward of a step (``loss(model(x), target)``) holds the loss's ops, which run after the model's
forward and before its backward. Priced as a model of their own (a separate ``perfcheck.estimate`` of the loss), they
read as a tight loop's: a cross-entropy over (4, 10) logits 9-20 us, where in a step it ran 80-190 us on the project's
AMD EPYC (process time, 2026-11-27; 8-10 us in a tight loop): its code and data a step old. One estimate of the model
and its loss together prices them with the step around them (the estimator's far rule: 80 us).
"""
from __future__ import annotations

import torch

from perfcheck.schema import ROOT

#: The model's name inside ``StepModel`` (its module paths there start with it).
MODEL = "model"


class StepModel(torch.nn.Module):
    """``loss(model(*inputs), target)`` as one module, the model under ``MODEL``."""

    def __init__(self, model, loss, target):
        super().__init__()
        self.model, self.loss, self.target = model, loss, target

    def forward(self, *inputs):
        return self.loss(self.model(*inputs), self.target)


def model_path(path: str):
    """The model's own module path of a ``StepModel`` row (``model.x`` -> ``x``, ``model`` -> ROOT); None for the
    step's root."""
    if path == MODEL:
        return ROOT
    return path[len(MODEL) + 1:] if path.startswith(MODEL + ".") else None


def step_seconds(pred) -> float:
    """A ``StepModel`` estimate's whole step: the root's forward (the loss's included), backward and optimizer."""
    root = pred[pred["module"] == ROOT].iloc[0]
    return float(root.pred_fwd_s + root.pred_bwd_s + root.pred_optim_s)
