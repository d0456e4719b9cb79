"""Calibration: measure this machine and write its system spec.

``perfcheck calibrate``'s micro-benchmarks of this machine (``cases``: GEMMs, copies, launches;
``collectives``: all-reduce/all-gather/... by size), fitted into a system spec (``fit``); ``run``
drives them and writes the spec file."""
