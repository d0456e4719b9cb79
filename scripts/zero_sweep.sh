#!/usr/bin/env bash
# Run one training job per ZeRO stage under DeepSpeed's launcher and compare predicted with measured.
#
#   scripts/zero_sweep.sh [--stages "0 1 2 3"] [--num_gpus N] [--hostfile FILE] [--model lenet|gpt2]
#                         [--script PATH] [--steps N] [--micro-batch N] [--extra-config JSON] [--out DIR] [--force]
#
# Defaults run anywhere with no download: the LeNet of DeepSpeed's CIFAR-10 example
# (perfcheck.examples.models.Net) on CIFAR-shaped synthetic data; on a machine without CUDA 2 ranks
# on CPU (DS_ACCELERATOR=cpu, gloo), with CUDA every visible GPU (NCCL).
# Stage S uses configs/deepspeed/base.json + configs/deepspeed/stage<S>.json (S may name any overlay
# there, e.g. "3-gather"), the same seed and data. Each stage's run directory is <out>/stage<S>/
# with its launcher log; a stage whose results are complete is skipped unless --force. A failing
# stage (crash, OOM, a rank dying) does not stop the others: the comparison marks it with the tail
# of its log and this script exits non-zero at the end. All arithmetic lives in the perfcheck
# package (perfcheck compare); this script only orchestrates.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
STAGES="0 1 2 3"
NUM_GPUS=""
HOSTFILE=""
MODEL="lenet"
SCRIPT=""
STEPS=""
MICRO=""
EXTRA=""
OUT="runs/zero_sweep"
FORCE=0

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --stages) STAGES="$2"; shift 2 ;;
    --num_gpus|--num-gpus) NUM_GPUS="$2"; shift 2 ;;
    --hostfile) HOSTFILE="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --script) SCRIPT="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --micro-batch) MICRO="$2"; shift 2 ;;
    --extra-config) EXTRA="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "zero_sweep.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

GPUS="$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
if [ "$GPUS" -gt 0 ]; then
  NUM_GPUS="${NUM_GPUS:-$GPUS}"
else
  export DS_ACCELERATOR=cpu
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"   # 2 ranks sharing a few cores: no oversubscription
  NUM_GPUS="${NUM_GPUS:-2}"
fi
mkdir -p "$OUT"
FAILED=()
RUN_DIRS=()

for S in $STAGES; do
  OVERLAY="$ROOT/configs/deepspeed/stage$S.json"
  DIR="$OUT/stage$S"
  if [ ! -f "$OVERLAY" ]; then
    echo "zero_sweep.sh: no overlay $OVERLAY for stage $S" >&2; FAILED+=("$S"); continue
  fi
  RUN_DIRS+=("$DIR")
  if [ "$FORCE" -eq 0 ] && "$PYTHON" -c 'import sys; from perfcheck.analysis.stages import stage_complete; sys.exit(0 if stage_complete(sys.argv[1]) else 1)' "$DIR"; then
    echo "== stage $S: complete in $DIR, skipped (--force reruns it)"; continue
  fi
  rm -rf "$DIR"; mkdir -p "$DIR"
  PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  LAUNCH=(deepspeed --master_port "$PORT")
  if [ -n "$HOSTFILE" ]; then LAUNCH+=(--hostfile "$HOSTFILE"); else LAUNCH+=(--num_gpus "$NUM_GPUS"); fi
  if [ -n "$SCRIPT" ]; then LAUNCH+=("$SCRIPT"); else LAUNCH+=(--module perfcheck.examples.train_ds); fi
  ARGS=(--config "$ROOT/configs/deepspeed/base.json" --overlay "$OVERLAY" --model "$MODEL" --out "$DIR")
  [ -n "$EXTRA" ] && ARGS+=(--overlay "$EXTRA")
  [ -n "$STEPS" ] && ARGS+=(--steps "$STEPS")
  [ -n "$MICRO" ] && ARGS+=(--micro-batch "$MICRO")
  echo "== stage $S: ${LAUNCH[*]} ${ARGS[*]}"
  if ! "${LAUNCH[@]}" "${ARGS[@]}" ${PERFCHECK_SWEEP_SCRIPT_ARGS:-} > "$DIR/launcher.log" 2>&1; then
    echo "== stage $S FAILED (log: $DIR/launcher.log)"; tail -n 5 "$DIR/launcher.log" | sed 's/^/   /'
    FAILED+=("$S")
  fi
done

"$PYTHON" -m perfcheck compare "${RUN_DIRS[@]}" --out "$OUT"
RC=$?
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "zero_sweep.sh: stage(s) ${FAILED[*]} failed" >&2
  exit 1
fi
exit $RC
