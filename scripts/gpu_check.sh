#!/usr/bin/env bash
# One visit to a GPU machine, one command: GPU-marked tests (DeepSpeed's too, when it imports), the
# overhead benchmark (GPT-2 small bf16 and LeNet, with torch.profiler and DeepSpeed's flops profiler),
# calibration and the accuracy table, all written to one folder ($OUT if set, else gpu_check_out/).
# Installs nothing from the network: run it where perfcheck's dependencies are installed (this
# checkout is put first on PYTHONPATH, so `pip install -e .` is not required). Wheels in $WHEELS
# (a folder of *.whl, e.g. deepspeed and its pure-Python needs) are installed --no-index first.
# Every step has a time limit; a failing step does not stop the others; summary.txt lists every
# step's exit code and time; results.tar.gz holds every log, CSV, run directory and the junit XML.
#   OUT=/tmp/gpu scripts/gpu_check.sh                 # all steps
#   STEPS="pytest overhead" scripts/gpu_check.sh      # a subset: env pytest overhead calibrate accuracy run
#   PYTEST_ARGS="tests/test_gpu_timing.py" ...        # which tests (default: every gpu-marked test)
#   DEADLINE=560 ...                                   # cap every step so the whole script ends in time
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${OUT:-gpu_check_out}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
WORK=${WORK:-/tmp/perfcheck_gpu_check}
rm -rf "$WORK"; mkdir -p "$WORK"
PY=${PYTHON:-python3}
STEPS=${STEPS:-"env pytest overhead calibrate accuracy"}
# the calibration cache of this visit stays in $WORK (and comes back in results.tar.gz)
export PERFCHECK_CACHE_DIR=${PERFCHECK_CACHE_DIR:-$WORK/cache}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PIP_NO_INDEX=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 DS_BUILD_OPS=0
: > "$WORK/summary.txt"
FAILED=0
T_START=$SECONDS

want() { [[ " $STEPS " == *" $1 "* ]]; }

step() {  # step NAME LIMIT_S CMD...: run with a time limit, log to NAME.log, record exit code and seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  if [ -n "${DEADLINE:-}" ]; then  # DEADLINE=S: the whole script ends within S seconds (30 s kept to pack up)
    local left=$((DEADLINE - (SECONDS - T_START) - 30))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 15 ]; then echo "== $name: skipped, DEADLINE reached" | tee -a "$WORK/summary.txt"; return; fi
  fi
  echo "== $name (limit ${limit}s): $*" | tee -a "$WORK/summary.txt"
  timeout -k 10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
  echo "   exit $rc$([ $rc -eq 124 ] && echo ' (time limit)'), $((SECONDS - t0)) s, log $name.log" | tee -a "$WORK/summary.txt"
  tail -n 3 "$WORK/$name.log" | sed 's/^/   | /'
}

if [ -n "${WHEELS:-}" ] && compgen -G "$WHEELS/*.whl" > /dev/null; then
  step wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$WHEELS"/*.whl
  export PYTHONPATH="$PYTHONPATH:$WORK/site" PATH="$WORK/site/bin:$PATH"
fi

step environment 60 "$PY" -c "import torch, perfcheck, platform, socket; print(socket.gethostname(), platform.platform()); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); \
print('devices', [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]); \
print('perfcheck', perfcheck.__version__)
try:
    import deepspeed; print('deepspeed', deepspeed.__version__)
except Exception as exc: print('deepspeed unavailable', exc)"
command -v nvidia-smi > /dev/null && step nvidia_smi 60 nvidia-smi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,uuid,memory.total,clocks.max.sm,power.limit \
  --format=csv > "$WORK/gpu.csv" 2>&1
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device visible: only the environment was recorded" | tee -a "$WORK/summary.txt"
  cp "$WORK/summary.txt" "$DIR/"; exit 1
fi

if want pytest; then
  TO=()  # a hung test fails alone instead of eating the step's whole limit (pytest-timeout, where installed)
  "$PY" -c "import pytest_timeout" 2> /dev/null && TO=(--timeout "${PYTEST_TIMEOUT:-150}")
  step pytest_gpu "${PYTEST_LIMIT:-420}" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider -o addopts="" "${TO[@]}" \
    --basetemp "$WORK/pytest_tmp" --junitxml "$WORK/pytest_gpu.xml" ${PYTEST_ARGS:-tests}
fi
if want overhead; then
  step overhead_gpt2 180 "$PY" bench/bench_overhead.py --model gpt2-small --dtype bf16 --rounds 30 \
    --compare-rounds 10 --write "$WORK/overhead_gpt2.md"
  step overhead_lenet 120 "$PY" bench/bench_overhead.py --model lenet --rounds 100 --compare-rounds 30 \
    --write "$WORK/overhead_lenet.md"
  # batch 8 is host-bound on a slow host (the hooks' host time is then step time); batch 32 is device-bound
  step overhead_gpt2_b32 150 "$PY" bench/bench_overhead.py --model gpt2-small --dtype bf16 --batch 32 --rounds 15 \
    --compare-rounds 5 --write "$WORK/overhead_gpt2_b32.md"
  # 101 tiny Linear modules: the per-module-call cost, host-bound by construction
  step overhead_chain 90 "$PY" bench/bench_overhead.py --model chain --rounds 100 --compare-rounds 20 \
    --write "$WORK/overhead_chain.md"
fi
if want calibrate; then
  step calibrate "${CALIBRATE_LIMIT:-150}" "$PY" -m perfcheck calibrate ${CALIBRATE_MODE:---full} \
    --output "$WORK/calibrated.json" --csv "$WORK/calibration.csv"
  [ -f "$WORK/calibrated.json" ] && step systems_show 60 "$PY" -m perfcheck systems "$WORK/calibrated.json"
fi
if want accuracy; then
  CAL=()
  [ -f "$WORK/calibrated.json" ] && CAL=(--calibrated "$WORK/calibrated.json" --no-ceilings)
  [ -n "${CALIBRATED:-}" ] && CAL=(--calibrated "$CALIBRATED" --no-ceilings)
  step accuracy "${ACCURACY_LIMIT:-300}" "$PY" bench/accuracy.py --device cuda --models "${ACCURACY_MODELS:-gpt,graph,lenet}" \
    --rounds "${ACCURACY_ROUNDS:-3}" --steps 10 "${CAL[@]}" --csv "$WORK/accuracy.csv" --write "$WORK/accuracy.md"
  step accuracy_gpt_b32 "${ACCURACY_LIMIT:-300}" "$PY" bench/accuracy.py --device cuda --models gpt --gpt-batch 32 \
    --rounds "${ACCURACY_ROUNDS:-3}" --steps 5 "${CAL[@]}" --csv "$WORK/accuracy_gpt_b32.csv" --write "$WORK/accuracy_gpt_b32.md"
fi
if want run; then  # a CUDA run directory, its report, and its what-if on the other Hopper (h100-sxm <-> h200)
  step run_gpt 120 "$PY" -m perfcheck run --model gpt --device cuda --batch-size "${RUN_BATCH:-32}" --steps 10 \
    --out "$WORK/run_gpt"
  step report_gpt 60 "$PY" -m perfcheck report "$WORK/run_gpt"
  step whatif_gpt 60 "$PY" -m perfcheck whatif "$WORK/run_gpt" --from "${WHATIF_FROM:-h100-sxm}" \
    --system "${WHATIF_TARGET:-h200}" --format csv \
    --output "$WORK/whatif_gpt.csv"
fi
echo "$FAILED step(s) failed; $((SECONDS - T_START)) s in all" | tee -a "$WORK/summary.txt"
# Results back: small files beside the archive; traces over 20 MB are left out of it.
find "$WORK" -name "trace.json" -size +20M -delete
find "$WORK" -name "*.pt" -delete
cp "$WORK/summary.txt" "$DIR/"
for f in pytest_gpu.xml overhead_gpt2.md accuracy.md calibrated.json; do
  [ -f "$WORK/$f" ] && cp "$WORK/$f" "$DIR/"
done
tar -C "$(dirname "$WORK")" --exclude site -czf "$DIR/results.tar.gz" "$(basename "$WORK")"
exit $((FAILED > 0))
