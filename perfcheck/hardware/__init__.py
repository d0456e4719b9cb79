"""Hardware: the systems perfcheck predicts for, as data with public sources.

System specs as data (``specs/*.json``, every number with a public source), their
loader (``systems``), and ``calibrate/``, which measures this machine and writes a spec file."""
