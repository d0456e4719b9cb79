#!/usr/bin/env bash
# One visit to a GPU machine, one command, sized for one call (issue 24: DEADLINE=400 s in all, starts apart):
# calibration (--full, host cases cold on the host clock, GPU kernel classes by size), the accuracy benchmark
# (LeNet, JSC_Tiny, graph, GPT-2 small bf16 at batch 8 and 32, per-class medians), the overhead benchmark
# (timing mode vs torch.profiler vs DeepSpeed's flops profiler, GPT-2 small batch 8), the events-vs-kernels
# check repeated 5 times with its jitter, a raw host/kernel diagnostic, then the gpu-marked tests with what
# time is left. Everything lands in $OUT (default gpu_check_out/): summary.txt, results.tar.gz (every log,
# CSV and JSON) and a few small files beside it (at most 8 files in all: the device returns no more).
#
# Installs nothing from the network: wheels in $WHEELS (deepspeed and the pure-Python packages it needs that
# the device lacks) are installed --no-index into $WORK/site first; this checkout is put first on PYTHONPATH.
# Every step has a time limit (its budget, below); DEADLINE caps each limit so the script ends in time, and
# a step that no longer fits is skipped with a note. A failing step does not stop the others.
#   DEADLINE=400 WHEELS=.whl bash scripts/gpu_check.sh          # the one call (on the device: OUT is set)
#   DRY=1 OUT=/tmp/dry bash scripts/gpu_check.sh                # every step on a CPU at tiny sizes (a dry run)
#   STEPS="calibrate accuracy" ...                              # a subset (names below)
#
# Budget (seconds, H100 VM timings of 2026-11-22/23 in bench/gpu_results/, plus this script's new parts sized on
# CPU stand-ins; in the order run, most valuable first):
#   wheels 10 | environment 15 | calibrate 100 (call 10: 60 s for --full --no-comm; + cold host cases ~10 s,
#   + gpu_ops ~15 s) | accuracy 50 (call 10: 41 s, lenet,jsc,gpt,graph x 3 rounds x 10 steps) | accuracy_b32 25
#   (call 10: 20 s) | overhead 45 (call 1: 31 s at 30/10 rounds; 20/8 here) | evk 45 (the test's GPT fixture took
#   12 s; 5 repeats in one process) | pytest 60 (tests/measure/test_gpu_timing.py, test_measure_timer.py,
#   test_gpu_kernels.py: ~45 s in 2026-11-23's runs) | diag the rest, up to 50 (scripts/gpu_phases.py: phases of
#   LeNet and JSC, then per-op host costs tight loop vs in sequence: ~30 s each in 2026-11-23's calls 4, 5, 8)
#   | packing 12. Sum 350 before diag: on DEADLINE=400 diag gets ~40 s. Not in the default STEPS (name them):
#   layers 75 (bench/layer_gpu.py: a torchtitan Llama block at the published rows' shapes, + SUSTAIN_S s back to back) |
#   heldout 90 (bench/heldout_gpu.py, 15 models; H200 2026-11-27: 88 s phases only, --no-modules; the per-module
#   hooks hung then, fixed since but not yet timed on a GPU) | beside 60 (bench/gemm_beside_copy.py: 24 s on an H200) |
#   softmax 30 (bench/elementwise_gpu.py --softmax: 21 row lengths x dtypes x phases; sized on CPU, not yet timed on a GPU) |
#   inplace 20 (bench/elementwise_gpu.py --inplace: add_/mul_ against a copy, 1 MiB-1 GiB; sized on CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${OUT:-gpu_check_out}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
WORK=${WORK:-/tmp/perfcheck_gpu_check}
rm -rf "$WORK"; mkdir -p "$WORK"
PY=${PYTHON:-python3}
DRY=${DRY:-}
STEPS=${STEPS:-"env calibrate accuracy overhead evk pytest diag"}
export PERFCHECK_CACHE_DIR=${PERFCHECK_CACHE_DIR:-$WORK/cache}  # this visit's calibration cache stays in $WORK
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PIP_NO_INDEX=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 DS_BUILD_OPS=0
: > "$WORK/summary.txt"
FAILED=0
T_START=$SECONDS
if [ -n "$DRY" ]; then  # a CPU dry run: the same steps on tiny sizes, cuda replaced by cpu
  DEV=cpu; export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=""
else
  DEV=cuda
fi

want() { [[ " $STEPS " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$WORK/summary.txt"; }

step() {  # step NAME LIMIT_S CMD...: run with a time limit, log to NAME.log, record exit code and seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  if [ -n "${DEADLINE:-}" ]; then  # DEADLINE=S: the whole script ends within S seconds (12 s kept to pack up)
    local left=$((DEADLINE - (SECONDS - T_START) - 12))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 10 ]; then note "== $name: skipped, DEADLINE reached ($((SECONDS - T_START)) s used)"; return; fi
  fi
  note "== $name (limit ${limit}s, at $((SECONDS - T_START)) s): $*"
  timeout -k 5 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && FAILED=$((FAILED + 1))
  note "   exit $rc$([ $rc -eq 124 ] && echo ' (time limit)'), $((SECONDS - t0)) s, log $name.log"
  tail -n 2 "$WORK/$name.log" | cut -c1-200 | sed 's/^/   | /'
}

if [ -n "${WHEELS:-}" ] && compgen -G "$WHEELS/*.whl" > /dev/null; then  # budget 10 s (1 s seen)
  step wheels 30 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$WHEELS"/*.whl
  export PYTHONPATH="$PYTHONPATH:$WORK/site" PATH="$WORK/site/bin:$PATH"
fi

if want env; then  # budget 15 s (7-8 s seen)
  step environment 30 "$PY" -c "import torch, perfcheck, platform, socket; print(socket.gethostname(), platform.platform()); \
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available()); \
print('devices', [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]); \
print('perfcheck', perfcheck.__version__, perfcheck.__file__); \
import os; print('cpu', next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '?'), \
'cores', os.cpu_count(), 'MHz', [l.split(':')[1].strip() for l in open('/proc/cpuinfo') if l.startswith('cpu MHz')][:4], 'load', os.getloadavg())
try:
    import deepspeed; print('deepspeed', deepspeed.__version__)
except Exception as exc: print('deepspeed unavailable', exc)"
  command -v nvidia-smi > /dev/null && nvidia-smi > "$WORK/nvidia_smi.log" 2>&1 && nvidia-smi \
    --query-gpu=name,driver_version,uuid,memory.total,clocks.max.sm,power.limit --format=csv > "$WORK/gpu.csv" 2>&1
fi
if [ -z "$DRY" ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  note "no CUDA device visible: only the environment was recorded"
  cp "$WORK/summary.txt" "$DIR/"; tar -C "$(dirname "$WORK")" --exclude site -czf "$DIR/results.tar.gz" "$(basename "$WORK")"
  exit 1
fi

if want calibrate; then  # budget 100 s
  if [ -n "$DRY" ]; then MODE=(--quick --threads 1); else MODE=(--full); fi
  step calibrate 100 "$PY" -m perfcheck calibrate "${MODE[@]}" --device $DEV --no-comm \
    --output "$WORK/calibrated.json" --csv "$WORK/calibration.csv"
  if [ ! -f "$WORK/calibrated.json" ] && [ -z "$DRY" ]; then  # the full one failed or ran out of time: a quick one
    note "   calibrate --full wrote no system file: a quick calibration instead (the accuracy steps need one)"
    step calibrate_quick 40 "$PY" -m perfcheck calibrate --quick --device $DEV --no-comm \
      --output "$WORK/calibrated.json" --csv "$WORK/calibration_quick.csv"
  fi
  [ -f "$WORK/calibrated.json" ] && "$PY" -m perfcheck systems "$WORK/calibrated.json" > "$WORK/systems_show.log" 2>&1
fi
CAL=()
[ -f "$WORK/calibrated.json" ] && CAL=(--calibrated "$WORK/calibrated.json" --no-ceilings)
[ -n "${CALIBRATED:-}" ] && CAL=(--calibrated "$CALIBRATED" --no-ceilings)
if want accuracy; then  # budget 50 + 25 s
  if [ -n "$DRY" ]; then ACC=(--models lenet,jsc --rounds 1 --steps 2 --threads 1); ACC32=(--models jsc --rounds 1 --steps 2 --threads 1)
  else ACC=(--models "${ACC_MODELS:-lenet,jsc,gpt,graph}" --rounds 3 --steps 10); ACC32=(--models gpt --gpt-batch 32 --rounds 3 --steps 5); fi
  [ ${#CAL[@]} -eq 0 ] && CAL=(--no-ceilings)  # no calibration file: each round calibrates (quick)
  step accuracy 50 "$PY" bench/accuracy.py --device $DEV "${ACC[@]}" "${CAL[@]}" \
    --csv "$WORK/accuracy.csv" --write "$WORK/accuracy.md"
  step accuracy_gpt_b32 25 "$PY" bench/accuracy.py --device $DEV "${ACC32[@]}" "${CAL[@]}" \
    --csv "$WORK/accuracy_gpt_b32.csv" --write "$WORK/accuracy_gpt_b32.md"
fi
if want overhead; then  # budget 45 s: timing mode vs torch.profiler vs DeepSpeed's profiler, GPT-2 small bf16 b8
  if [ -n "$DRY" ]; then OV=(--model lenet --rounds 6 --compare-rounds 3 --threads 1)
  else OV=(--model gpt2-small --dtype bf16 --rounds 20 --compare-rounds 8); fi
  step overhead_gpt2 45 "$PY" bench/bench_overhead.py "${OV[@]}" --write "$WORK/overhead_gpt2.md"
fi
if want evk; then  # budget 45 s: events vs kernels, 5 repeats in one process, with the events' jitter
  if [ -n "$DRY" ]; then EV=(--device cpu --tiny --repeats 2 --steps 3); else EV=(--repeats 5 --steps 8); fi
  step evk 45 "$PY" scripts/gpu_events_vs_kernels.py "${EV[@]}" --csv "$WORK/events_vs_kernels.csv"
fi
if want pytest; then  # the rest of the time: the timer's CUDA tests and the kernel table (events vs kernels once more)
  TO=()
  "$PY" -c "import pytest_timeout" 2> /dev/null && TO=(--timeout 60)
  step pytest_gpu "${PYTEST_LIMIT:-60}" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider -o addopts="" "${TO[@]}" \
    --basetemp "$WORK/pytest_tmp" --junitxml "$WORK/pytest_gpu.xml" \
    ${PYTEST_ARGS:-tests/measure/test_gpu_timing.py tests/measure/test_measure_timer.py tests/measure/test_gpu_kernels.py}
fi
if want diag; then  # budget: the rest, up to 50 s: raw host cost per phase (issue vs synced) and per op (tight loop vs in sequence)
  SYS=()
  [ -f "$WORK/calibrated.json" ] && SYS=(--system "$WORK/calibrated.json")
  step diag_phases 20 "$PY" scripts/gpu_phases.py --models lenet,jsc --steps 5 "${SYS[@]}" --csv "$WORK/phases.csv"
  step diag_ops 30 "$PY" scripts/gpu_phases.py --ops --csv "$WORK/phases_ops.csv"
fi
if want hooks; then  # budget 30 s: PerfCheck's hooks' host cost per module, fwd and bwd (the observer effect)
  if [ -n "$DRY" ]; then HK=(--models chain,jsc --steps 3); else HK=(--models chain,gpt --steps 10); fi
  step hooks 30 "$PY" scripts/gpu_hook_cost.py "${HK[@]}" --csv "$WORK/hook_cost.csv"
fi
if want late; then  # budget 20 s: LeNet and JSC again at the end of the call (does the host drift within a VM?)
  if [ -n "$DRY" ]; then LT=(--models jsc --rounds 1 --steps 2 --threads 1); else LT=(--models lenet,jsc --rounds 3 --steps 10); fi
  step accuracy_late 25 "$PY" bench/accuracy.py --device $DEV "${LT[@]}" "${CAL[@]}" \
    --csv "$WORK/accuracy_late.csv" --write "$WORK/accuracy_late.md"
fi
if want heldout; then  # budget 90 s: the held-out models (bench/heldout.py's split) on CUDA, fp32, CUDA events
  if [ -n "$DRY" ]; then HO=(--device cpu --models wide_deep,nn_decoder --steps 2); else HO=(--steps 10); fi
  SYS=()
  [ -f "$WORK/calibrated.json" ] && SYS=(--system "$WORK/calibrated.json")
  step heldout_gpu "${HELDOUT_S:-90}" "$PY" bench/heldout_gpu.py "${HO[@]}" "${SYS[@]}" --csv "$WORK/heldout_gpu.csv"
fi
if want beside; then  # budget 60 s: a GEMM's / an add's rate beside a k-CTA copy kernel (collectives' SMs and HBM)
  if [ -z "$DRY" ]; then step beside 60 "$PY" bench/gemm_beside_copy.py --csv "$WORK/beside.csv"; fi
fi
if want softmax; then  # budget 30 s: torch's softmax fwd/bwd by row length and dtype (aten_costs.softmax_class's two kernels)
  if [ -n "$DRY" ]; then SM=(--device cpu --tiny); else SM=(--iters 10); fi
  # the fraction is of the H200's bandwidth when the card is one, else the H100 SXM's (the kinds lent)
  SMSYS=$("$PY" -c "import torch; print('h200' if torch.cuda.is_available() and 'H200' in torch.cuda.get_device_name() else 'h100-sxm')" 2>/dev/null || echo h100-sxm)
  step softmax 30 "$PY" bench/elementwise_gpu.py "${SM[@]}" --softmax --system "$SMSYS" --csv "$WORK/softmax.csv"
fi
if want inplace; then  # budget 20 s: in-place add_/mul_ against a copy and add(out=), 1 MiB-1 GiB (predict.write_allocate)
  if [ -n "$DRY" ]; then IP=(--device cpu --tiny --iters 3); else IP=(--iters 20); fi
  IPSYS=$("$PY" -c "import torch; print('h200' if torch.cuda.is_available() and 'H200' in torch.cuda.get_device_name() else 'h100-sxm')" 2>/dev/null || echo h100-sxm)
  step inplace 25 "$PY" bench/elementwise_gpu.py "${IP[@]}" --inplace --system "$IPSYS" --csv "$WORK/inplace.csv"
fi
if want layers; then  # budget 60 s: a torchtitan Llama block (8B, 13B, 70B shapes), fwd/bwd by CUDA events + kernel table
  if [ -n "$DRY" ]; then LY=(--device cpu --tiny --iters 1); else LY=(--iters 8 --sustain "${SUSTAIN_S:-20}"); fi
  step layers 75 "$PY" bench/layer_gpu.py "${LY[@]}" --csv "$WORK/layers.csv"
fi
if want run; then  # optional (not in the default STEPS): a CUDA run directory and its what-if on the other Hopper
  step run_gpt 60 "$PY" -m perfcheck run --model gpt --device $DEV --batch-size "${RUN_BATCH:-32}" --steps 10 --out "$WORK/run_gpt"
  step whatif_gpt 30 "$PY" -m perfcheck whatif "$WORK/run_gpt" --from "${WHATIF_FROM:-h100-sxm}" \
    --system "${WHATIF_TARGET:-h200}" --format csv --output "$WORK/whatif_gpt.csv"
fi

note "$FAILED step(s) failed; $((SECONDS - T_START)) s in all"
# The short table (the device reply shows only the last 12,000 characters of output)
{
  echo "======== summary ($(date -u +%H:%M:%S) UTC, $((SECONDS - T_START)) s) ========"
  for f in accuracy accuracy_gpt_b32 accuracy_late; do grep -h "^STEP \|^CLASS " "$WORK/$f.log" 2>/dev/null | sed "s/^/$f | /"; done
  grep -h "^| bare \|^| perfcheck timing (hooks) |\|^| torch.profiler\|^| deepspeed" "$WORK"/overhead_gpt2.md 2>/dev/null \
    | cut -d'|' -f2-4,8 | sed 's/^/overhead gpt2 b8 |/'
  grep -h "^EVK\|^repeat" "$WORK"/evk.log 2>/dev/null
  grep -h "us/module" "$WORK"/hooks.log 2>/dev/null | sed 's/^/hooks | /'
  grep -h "^cpu " "$WORK"/environment.log 2>/dev/null
  grep -h "^| design\|^| scoring\|^| [A-Za-z ]* | [0-9.-]* \[" "$WORK"/heldout_gpu.log 2>/dev/null | sed 's/^/heldout_gpu /'
  grep -h "^| \(gemm\|add\)\|^device" "$WORK"/beside.log 2>/dev/null | sed 's/^/beside /'
  grep -h "^LAYER\|^SUSTAIN" "$WORK"/layers.log 2>/dev/null
  grep -h "^EW inplace" "$WORK"/inplace.log 2>/dev/null
  "$PY" - "$WORK" <<'EOF' 2>&1 | tail -40
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
f = w / "calibrated.json"
if f.exists():
    d = json.loads(f.read_text())
    h = d.get("host", {})
    print("calibrated host: " + ", ".join(f"{k} {h[k] * 1e6:.1f} us" for k in
          ("op_dispatch_s", "op_cold_s", "op_cold_bf16_s", "backward_call_s", "device_kernel_s", "optim_step_s",
           "optim_sgd_foreach_step_s", "optim_sgd_foreach_per_tensor_s") if k in h))
    fx = d.get("op_fixed_s", {})
    print("op_fixed_s (us): " + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in sorted(fx.items())))
    for k, pts in sorted(d.get("op_efficiency_curve", {}).items()):
        print(f"curve {k:<58} " + " ".join(f"{x * 1e6:.0f}us:{e:.2f}" for x, e in pts))
    eff = d.get("op_efficiency", {})
    print("op_efficiency: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(eff.items())))
c = w / "calibration.csv"
if c.exists():  # the round-robin tight vs after the cold filler (op_cold_s is fitted from the latter on a GPU)
    import csv
    for r in csv.DictReader(open(c)):
        if r["kind"] == "opcold":
            print(f"opcold {r['label']} {r['dtype']}: {float(r['seconds']) * 1e6:.2f} us per op")
EOF
  grep -h "passed\|failed" "$WORK"/pytest_gpu.log 2>/dev/null | tail -1
} | tee -a "$WORK/summary.txt"
# Results back: one archive + small files beside it (at most 8 files)
find "$WORK" -name "trace.json" -size +5M -delete
find "$WORK" \( -name "*.pt" -o -name "*.pyc" \) -delete
rm -rf "$WORK/pytest_tmp"
cp "$WORK/summary.txt" "$DIR/"
for f in calibrated.json accuracy.md accuracy_gpt_b32.md overhead_gpt2.md events_vs_kernels.csv heldout_gpu.csv beside.csv; do
  [ -f "$WORK/$f" ] && cp "$WORK/$f" "$DIR/"
done
tar -C "$(dirname "$WORK")" --exclude site -czf "$DIR/results.tar.gz" "$(basename "$WORK")"
echo "archive $(du -h "$DIR/results.tar.gz" | cut -f1), files: $(ls "$DIR" | tr '\n' ' ')"
exit $((FAILED > 0))
