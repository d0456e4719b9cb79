#!/usr/bin/env bash
# Install perfcheck and its test dependencies into the current Python.
# torch goes in first, pinned, when it is missing: an unpinned `pip install torch` pulls GBs of
# CUDA wheels, while torch==2.13.0 is a local CPU build on these machines. setup.cfg keeps a
# range users can live with (torch>=2.4), which the installed 2.13.0 satisfies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install --quiet "torch==2.13.0"
fi
"$PY" -m pip install --quiet -e ".[test]"
