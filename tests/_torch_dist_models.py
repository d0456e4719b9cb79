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


# ---- per-rank TP FLOPs, FSDP2+TP, accumulation -----------------------------------------------------
class FFN(nn.Module):
    """Linear(d, 4d) -> ReLU -> Linear(4d, d): Megatron's TP MLP (up column-wise, down row-wise)."""

    def __init__(self, d=16):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


TP_PLAN = {"up": "colwise", "down": "rowwise"}


def _styles(plan, sp=False):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    make = {"colwise": lambda: ColwiseParallel(input_layouts=Shard(1)) if sp else ColwiseParallel(),
            "rowwise": lambda: RowwiseParallel(output_layouts=Shard(1)) if sp else RowwiseParallel(),
            "sp": SequenceParallel}
    return {k: make[v]() for k, v in plan.items()}


def tp_ffn(d=16):
    """FFN on a 1-D tp mesh of the whole world (no SP)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    m = FFN(d)
    parallelize_module(m, init_device_mesh("cpu", (torch.distributed.get_world_size(),)), _styles(TP_PLAN))
    return m


def fsdp2_tp(dp=2, tp=2, d=16):
    """2-D FSDP2 + TP: the FFN tensor-parallel over mesh['tp'], fully_shard over mesh['dp']."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    m = FFN(d)
    parallelize_module(m, mesh["tp"], _styles(TP_PLAN))
    fully_shard(m.up, mesh=mesh["dp"])
    fully_shard(m.down, mesh=mesh["dp"])
    fully_shard(m, mesh=mesh["dp"])
    return m


def local_reference(model):
    """A plain nn.Module of one rank's local shards (DTensor ``to_local()``; FSDP2's all-gathered
    shapes): FlopCounterMode on it gives the rank's FLOPs, independently of perfcheck."""
    import copy

    ref = copy.deepcopy(FFN(model.up.in_features))
    for name in ("up", "down"):
        for pname in ("weight", "bias"):
            p = getattr(getattr(model, name), pname)
            spec = None
            state = getattr(getattr(model, name), "_get_fsdp_state", None)
            if state is not None:
                fp = next(f for f in state()._fsdp_param_group.fsdp_params if f._module_info.param_name == pname)
                spec = fp._unsharded_dtensor_spec
            if spec is not None:
                from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

                shape = compute_local_shape_and_global_offset(spec.shape, spec.mesh, spec.placements)[0]
            else:
                shape = p.to_local().shape if hasattr(p, "to_local") else p.shape
            setattr(getattr(ref, name), pname, nn.Parameter(torch.zeros(tuple(shape))))
    return ref


def fsdp2_tp_sp(dp=2, tp=2):
    """torchtitan's 2-D layout on the MLP block: norm SequenceParallel, up/down column/row-parallel
    with the sequence sharded between blocks, over mesh['tp']; fully_shard over mesh['dp']."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    m = MLP()
    parallelize_module(m, mesh["tp"], _styles({"norm": "sp", "up": "colwise", "down": "rowwise"}, sp=True))
    fully_shard(m, mesh=mesh["dp"])
    return m


# ---- real multi-process gloo runs (shared by the run tests) -----------------------------------------
def train(model, batch_of_step, steps: int, pc=None):
    """``steps`` SGD steps of ``model`` on ``batch_of_step(step)``, calling ``pc.step()`` after each when given."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        model(batch_of_step(step)).sum().backward()
        opt.step()
        opt.zero_grad()
        if pc is not None:
            pc.step()


def init_gloo(rank, port, world):
    """The worker side: join a ``world``-rank gloo group on localhost:``port``, one intra-op thread."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)


def save_result(out, rank, result):
    """The worker's end: its result as ``out/result<rank>.json``, then leave the group."""
    import json
    import os

    with open(os.path.join(out, f"result{rank}.json"), "w") as fh:
        json.dump(result, fh)
    torch.distributed.destroy_process_group()


def run_ranks(worker, nprocs, out) -> list:
    """Spawn ``worker(rank, port, out)`` on ``nprocs`` processes (a free localhost port) and return
    each rank's saved result."""
    import json
    import os
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, out), nprocs=nprocs, join=True)
    return [json.load(open(os.path.join(out, f"result{r}.json"))) for r in range(nprocs)]
