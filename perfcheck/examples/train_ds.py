"""Train an example model under DeepSpeed with perfcheck measuring it: what scripts/zero_sweep.sh runs.

    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 -m perfcheck.examples.train_ds \\
        --config configs/deepspeed/base.json --overlay configs/deepspeed/stage3.json --out runs/sweep/stage3

Every rank draws the same synthetic batches for a given --seed (the seed is mixed with the rank,
so ranks see different data, as data parallelism needs, and every stage sees the same data).
Rank 0 writes ``<out>/predicted.csv`` (``perfcheck.estimate`` of one micro-batch, compute only)
before DeepSpeed partitions the model, and ``<out>/run.json`` (the merged config and arguments).
``--fail-rank R --fail-step N`` makes rank R exit with status 3 at step N (to test failure paths).

Nothing is compiled by default: on DeepSpeed's CPU accelerator ``deepspeed.init_distributed`` would
JIT-build its shared-memory collective op (``deepspeed/comm/torch.py: build_shm_op``, minutes of C++
on a small machine, in a build cache shared by every environment, where a lock left by a killed build
hangs every later one). Training never uses that op (only ``inference_all_reduce`` does), so it is
marked unavailable unless ``--shm-comm``; the stage configs ask for torch's Adam (``torch_adam``).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import perfcheck.deepspeed as pds
from perfcheck.examples.models import EXAMPLES
from perfcheck.integrations.deepspeed.config import BLOCK_KEY, load_config, merge_configs, parse_block
from perfcheck.hardware.systems import torch_dtype
from perfcheck.predict.zero import dtype_from_deepspeed_config
from perfcheck.rundir import atomic_write_json

#: --model name -> perfcheck.examples.models.EXAMPLES key.
MODELS = {"lenet": "lenet", "gpt2": "gpt", "jsc": "jsc"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="base DeepSpeed config (JSON)")
    p.add_argument("--overlay", action="append", default=[], help="config merged over the base (repeatable)")
    p.add_argument("--model", default="lenet", choices=sorted(MODELS))
    p.add_argument("--steps", type=int, default=None, help="measured optimizer steps (perfcheck.steps)")
    p.add_argument("--out", required=True, help="run directory (perfcheck.output_dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--micro-batch", type=int, default=None, help="train_micro_batch_size_per_gpu")
    p.add_argument("--backend", default=None, help="torch.distributed backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--shm-comm", action="store_true",
                   help="let DeepSpeed JIT-build its CPU shared-memory collective op (off: nothing is compiled)")
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--fail-step", type=int, default=0)
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by the deepspeed launcher
    return p.parse_args(argv)


def build_config(args) -> dict:
    cfg = load_config(args.config)
    for overlay in args.overlay:
        cfg = merge_configs(cfg, load_config(overlay))
    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    block = {"output_dir": str(args.out), "label": f"{args.model}-zero{stage}"}
    if args.steps is not None:
        block["steps"] = args.steps
    if args.micro_batch is not None:
        cfg.pop("train_batch_size", None)
        cfg["train_micro_batch_size_per_gpu"] = args.micro_batch
    return merge_configs(cfg, {BLOCK_KEY: block})


def _cast(batch, dtype):
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in batch)


def _no_shm_comm_build():
    """Mark DeepSpeed's CPU shared-memory comm op unavailable, so init_distributed compiles nothing.

    ``deepspeed.ops.__compatible_ops__`` is the dict DeepSpeed consults before building it (it is
    computed once per process and kept, so the entry persists); a GPU accelerator never builds it.
    """
    import deepspeed.ops

    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def main(argv=None) -> int:
    args = parse_args(argv)
    import deepspeed
    import torch

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if not args.shm_comm:
        _no_shm_comm_build()
    deepspeed.init_distributed(dist_backend=backend)
    rank = torch.distributed.get_rank()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    cfg = build_config(args)
    block = parse_block(cfg)
    example = EXAMPLES[MODELS[args.model]]
    dtype = torch_dtype(dtype_from_deepspeed_config(cfg))
    torch.manual_seed(args.seed)
    model = example.build()
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    micro = int(cfg.get("train_micro_batch_size_per_gpu", example.default_batch))
    gas = int(cfg.get("gradient_accumulation_steps", 1))
    n_batches = 4
    data = [example.batch(micro, gen) for _ in range(n_batches)]
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "run.json", {"argv": sys.argv, "model": args.model, "seed": args.seed,
                                             "backend": backend, "config": cfg})
        pds.save_prediction(out, model, data[0][0], system=block.system if block else None,
                            dtype=dtype, config=cfg, world_size=torch.distributed.get_world_size())
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    engine, _, _, _ = pds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    total = (block.total_steps if block else 1) * gas
    for i in range(total):
        if args.fail_rank == rank and i // gas == args.fail_step:
            print(f"rank {rank}: failing on purpose at step {args.fail_step} (--fail-rank)", file=sys.stderr,
                  flush=True)
            os._exit(3)
        inputs, target = data[i % n_batches]
        inputs = tuple(t.to(device) for t in _cast(inputs, dtype))
        out = engine(*inputs)
        loss = example.loss(out.float(), target.to(device))
        engine.backward(loss)
        engine.step()
    if hasattr(engine, "finish"):
        engine.finish()
    if rank == 0:
        print(f"perfcheck: run directory {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
