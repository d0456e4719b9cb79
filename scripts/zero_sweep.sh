#!/usr/bin/env bash
# The ZeRO sweep (the README's main command): a thin wrapper around `perfcheck sweep`.
#
#   scripts/zero_sweep.sh [--stages "0 1 2 3 3-gather"] [--model lenet|gpt2|jsc] [--ranks N | --num_gpus N]
#                         [--hostfile FILE] [--script PATH] [--steps N] [--micro-batch N] [--extra-config JSON]
#                         [--out DIR] [--timeout S] [--optimizer torch|fused] [--force] [--verbose]
#
# Every option is `perfcheck sweep`'s (see `perfcheck sweep --help`); --num_gpus is kept as another
# name for --ranks, and $PERFCHECK_SWEEP_SCRIPT_ARGS becomes --script-args. All the work (launching a DeepSpeed job per stage with the package's stage
# configs, the per-stage timeout, the comparison) lives in the perfcheck package.
set -uo pipefail

PYTHON="${PYTHON:-python3}"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --num_gpus|--num-gpus) ARGS+=(--ranks "$2"); shift 2 ;;
    -h|--help) exec "$PYTHON" -m perfcheck sweep --help ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [ -n "${PERFCHECK_SWEEP_SCRIPT_ARGS:-}" ]; then ARGS+=(--script-args "$PERFCHECK_SWEEP_SCRIPT_ARGS"); fi
exec "$PYTHON" -m perfcheck sweep ${ARGS[@]+"${ARGS[@]}"}
