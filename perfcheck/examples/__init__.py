"""Example models (no downloads) used by ``perfcheck run``, the tests and the benchmarks."""
