#!/usr/bin/env bash
# One visit to a GPU machine, one command: GPU-marked tests, the overhead benchmark, calibration
# and the accuracy table, all written to one folder ($OUT if set, else gpu_check_out/).
# Installs nothing and needs no network: run it where perfcheck's dependencies are installed
# (this checkout is put first on PYTHONPATH, so `pip install -e .` is not required).
# A failing step does not stop the others; summary.txt lists every step's exit code and time.
#   OUT=/tmp/gpu scripts/gpu_check.sh            # or: scripts/gpu_check.sh --quick (shorter runs)
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${OUT:-gpu_check_out}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PIP_NO_INDEX=1 HF_HUB_OFFLINE=1
QUICK=0; [ "${1:-}" = "--quick" ] && QUICK=1
: > "$DIR/summary.txt"
FAILED=0

step() {  # step NAME CMD...: run, log to NAME.log, record exit code and seconds
  local name=$1; shift
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$DIR/summary.txt"
  "$@" > "$DIR/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
  echo "   exit $rc, $((SECONDS - t0)) s, log $name.log" | tee -a "$DIR/summary.txt"
}

step environment "$PY" -c "import torch, perfcheck, platform, socket; print(socket.gethostname(), platform.platform()); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); \
print('devices', [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]); \
print('perfcheck', perfcheck.__version__)"
command -v nvidia-smi > /dev/null && step nvidia_smi nvidia-smi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device visible: only the environment was recorded" | tee -a "$DIR/summary.txt"
  exit 1
fi

step pytest_gpu "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider --junitxml "$DIR/pytest_gpu.xml"
if [ $QUICK -eq 1 ]; then
  step bench_overhead "$PY" bench/bench_overhead.py --model gpt --rounds 5 --no-compare --write "$DIR/RESULTS.md"
  step calibrate "$PY" -m perfcheck calibrate --quick --output "$DIR/calibrated.json" --csv "$DIR/calibration.csv"
  step accuracy "$PY" bench/accuracy.py --device cuda --rounds 1 --steps 5 --csv "$DIR/accuracy.csv" --write "$DIR/RESULTS.md"
else
  step bench_overhead "$PY" bench/bench_overhead.py --micro --write "$DIR/RESULTS.md"
  step calibrate "$PY" -m perfcheck calibrate --output "$DIR/calibrated.json" --csv "$DIR/calibration.csv"
  step calibrate_full "$PY" -m perfcheck calibrate --full --output "$DIR/calibrated-full.json" --csv "$DIR/calibration-full.csv"
  step accuracy "$PY" bench/accuracy.py --device cuda --rounds 3 --steps 10 --csv "$DIR/accuracy.csv" --write "$DIR/RESULTS.md"
fi
[ -f "$DIR/calibrated.json" ] && step systems_show "$PY" -m perfcheck systems "$DIR/calibrated.json"
echo "$FAILED step(s) failed; results in $DIR" | tee -a "$DIR/summary.txt"
exit $((FAILED > 0))
