"""Models and layouts shared by the torch-native parallelism tests (a helper module, no tests)."""
import torch
import torch.nn as nn


class MLP(nn.Module):
    """A transformer MLP sub-block with its norm: the TP+SP unit (norm sequence-parallel, up
    column-wise, down row-wise; Megatron-LM's layout)."""

    def __init__(self, d=16, h=32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(self.norm(x))))


def plain():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(plain())


def fsdp2():
    from torch.distributed.fsdp import fully_shard

    m = plain()
    fully_shard(m[0])
    fully_shard(m[2])
    fully_shard(m)
    return m


def tp_sp():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    torch.manual_seed(0)
    m = MLP()
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    parallelize_module(m, mesh, {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                                 "down": RowwiseParallel(output_layouts=Shard(1))})
    return m


LAYOUTS = {"ddp": (ddp, (4, 16)), "fsdp2": (fsdp2, (4, 16)), "tp_sp": (tp_sp, (2, 8, 16))}


def batch(layout, step, rank):
    """The rank's batch of a step: data parallel ranks see different data, TP+SP ranks their
    sequence shard of one batch (Shard(1) input)."""
    shape = LAYOUTS[layout][1]
    g = torch.Generator().manual_seed(1000 * step + (rank if layout != "tp_sp" else 0))
    x = torch.randn(shape, generator=g)
    if layout == "tp_sp":
        n = shape[1] // torch.distributed.get_world_size()
        x = x[:, rank * n:(rank + 1) * n].contiguous()
    return x
