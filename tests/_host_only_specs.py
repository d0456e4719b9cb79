"""Shared by the host-model row tests: a ``cpu`` spec whose roofline terms vanish, so only the host, row and
GEMM terms are left to check by hand, and a module wrapping a plain function for the estimator."""
import dataclasses

import torch

from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.schema import ROOT

HUGE = 1e18  # FLOP/s and B/s so large that every roofline term is ~1e-14 s: only the host, row and GEMM terms are left


def cpu_spec_with_host(**host_values):
    """The ``cpu`` spec with every host constant 0 but ``host_values`` (its roofline terms as shipped)."""
    base = load_system("cpu")
    values = {k: 0.0 for k in host_constants(base)}
    values.update(host_values)
    return dataclasses.replace(base, host=values)


def host_only_spec(op_row_s=None, **host_values):
    """The ``cpu`` spec with every host constant 0 but ``host_values``, ``op_row_s`` as given, infinite FLOP/s and
    bandwidth."""
    base = cpu_spec_with_host(**host_values)
    return dataclasses.replace(base, matrix_flops_per_s={d: HUGE for d in base.matrix_flops_per_s},
                               vector_flops_per_s={d: HUGE for d in base.vector_flops_per_s},
                               mem_bandwidth_bytes_per_s=HUGE, matrix_efficiency_curve=(), mem_bandwidth_curve=(),
                               op_row_s=op_row_s or {})


class Fn(torch.nn.Module):
    """A module whose forward is ``fn``: the estimator traces a plain function through it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def root_row(frame):
    """The estimator frame's root row (the whole model)."""
    return frame.set_index("module").loc[ROOT]
