#!/usr/bin/env bash
# Accuracy table: measured / predicted time per reference model and module class, with the
# datasheet ceilings and with ceilings calibrated on this machine (bench/accuracy.py; its --help
# lists the options). Examples:
#   scripts/accuracy.sh                                      # this device, all models, 3 rounds
#   scripts/accuracy.sh --threads 1 --write bench/RESULTS.md # what bench/RESULTS.md holds for the CPU
#   scripts/accuracy.sh --device cuda --dtype bf16           # GPU (GPT-2 small, batch 8, seq 1024)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" bench/accuracy.py "$@"
