"""A Trainer run with PerfCheckCallback in its own process(es), for tests/integrations/test_integrations_hf.py.

    python -m torch.distributed.run --nproc_per_node 2 tests/_hf_script.py ddp OUT   # DDP on gloo
    python -m torch.distributed.run --nproc_per_node 2 tests/_hf_script.py fsdp OUT  # fsdp=True on gloo
    python tests/_hf_script.py deepspeed OUT                                         # ZeRO-1 on CPU

ddp, fsdp: the callback's out_dir is OUT/run; the final training loss is printed (LOSS) and written to
OUT/loss_rank<RANK>.txt. deepspeed: the DeepSpeed config's "perfcheck" block names
OUT/ds, and the callback is built with no arguments (the block alone says where the run goes).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _frameworks import hide_broken_torchvision, tiny_gpt2, tokens, training_args  # noqa: E402

hide_broken_torchvision()
import transformers  # noqa: E402

from perfcheck.integrations.transformers import PerfCheckCallback  # noqa: E402


def main(mode, out):
    if mode == "ddp":
        args = training_args(os.path.join(out, "trainer"), ddp_backend="gloo")
        callback = PerfCheckCallback(out_dir=os.path.join(out, "run"), system="cpu", sample_interval=None)
    elif mode == "fsdp":
        args = training_args(os.path.join(out, "trainer"), ddp_backend="gloo", fsdp=True,
                             fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]})
        callback = PerfCheckCallback(out_dir=os.path.join(out, "run"), system="cpu", sample_interval=None)
    else:
        from perfcheck.examples.train_ds import _no_shm_comm_build

        _no_shm_comm_build()  # DeepSpeed's CPU shared-memory comm op is never JIT-compiled by a test
        ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
              "perfcheck": {"enabled": True, "output_dir": os.path.join(out, "ds"), "warmup_steps": 1, "steps": 3,
                            "system": "cpu", "sampler_interval_s": None,
                            "profiler": {"enabled": True, "wait": 0, "warmup": 1, "active": 1}}}
        args = training_args(os.path.join(out, "trainer"), deepspeed=ds)
        callback = PerfCheckCallback()
    trainer = transformers.Trainer(model=tiny_gpt2(), args=args, train_dataset=tokens(), callbacks=[callback])
    result = trainer.train()
    print("LOSS", result.training_loss, flush=True)
    # and in a file per rank: two ranks' lines share torchrun's one stdout pipe, where one was once lost
    with open(os.path.join(out, f"loss_rank{os.environ.get('RANK', '0')}.txt"), "w") as f:
        f.write(repr(result.training_loss))
    print("RUN_DIR", callback.run_dir, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
