#!/usr/bin/env bash
# Install (scripts/install.sh) and run the whole test suite on CPU. GPU tests skip without CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export DS_ACCELERATOR=${DS_ACCELERATOR:-cpu}
exec "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider "$@"
