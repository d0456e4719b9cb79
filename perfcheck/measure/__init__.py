"""Measure: ``session.PerfCheck`` drives a run (steps, warm-up, profiler window, sampler);
``timer`` times every module's forward/backward/recompute with hooks (CUDA events on GPUs);
``kernel_table`` attributes profiler kernels to modules; ``sampler`` records utilization and memory;
``memory`` per-module CUDA memory; ``flops`` one FlopCounterMode step; ``context`` what the run is
(device, wrappers, parallel layout); ``rundir`` is the one reader/writer of a run directory."""
