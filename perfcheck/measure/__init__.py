"""Measure: time a real training run per module, phase and kernel, and write its run directory.

``session.Recorder`` records a run (steps, warm-up, profiler window, sampler) for ``perfcheck.session``'s PerfCheck;
``timer`` times every module's forward/backward/recompute with hooks (CUDA events on GPUs);
``kernel_table`` attributes profiler kernels to modules; ``sampler`` records utilization and memory;
``memory`` per-module CUDA memory; ``page_faults`` page faults per step and phase (``fault_cost`` what one costs
here, ``fault_record`` the columns and meta.json); ``flops`` one FlopCounterMode step; ``context`` what the run is
(device, wrappers, parallel layout); ``perfcheck.rundir`` is the one reader/writer of a run directory."""
