#!/usr/bin/env bash
# Every check that needs a GPU, in one command, ending in a table:
#   1. the GPUs as nvidia-smi shows them;
#   2. NVML through the worker's own code (gpuworker.TestOnRealGPU): one slot
#      per GPU pinned by UUID, the readings heartbeats carry, the health gate
#      on the real counters (XID, ECC, retired pages, row remaps, throttling);
#   3. an NCCL all-reduce across every GPU, sums checked (scripts/nccl_check.py);
#   4. the reference run through durabletrain: the embedded Temporal dev
#      server, one worker offering a slot per GPU, the starter, and
#      examples/pytorch/resnet18_fashion_mnist.py as an exec run on NCCL for
#      EPOCHS epochs of the full Fashion-MNIST. It reads the program's
#      CUDA_VISIBLE_DEVICES, the NVML readings in the ranks' heartbeats
#      (starter status) and the worker's Prometheus gauges while it trains,
#      then each epoch's time and test accuracy (target: >= 0.8976 after 10);
#   5. the same program launched by hand (no durabletrain), while the worker
#      is still up (its NVML open) and after it stopped, for the ratio.
#
# Usage: scripts/gpu-check.sh
#   BIN=dir       devserver, worker, starter, gpuworker.test (built here with go where missing)
#   DATA=dir      Fashion-MNIST's four .gz files (default Debian's /usr/share/datasets/fashion-mnist)
#   EPOCHS=n      of the reference run (default 10)
#   OUTDIR=dir    logs, the spec, progress.json and report.md (default .durabletrain/gpu-check)
#   PYTHON=path   a python3 with torch and torchvision (default: python3 on PATH)
#   WORKERS=n     ranks of the reference run, on this one worker (default: 4, as the reference, or every GPU where fewer)
#   EVERY_STEPS=n checkpoint.every_steps of the reference run (default 200; 0: at epoch ends only)
#   DIRECT_EPOCHS=n  epochs of the same program launched by hand afterwards (default 2; 0: none)
#   DIRECT_FIRST=n   epochs of it by hand before anything else (default 0): on a fresh machine
#                 the first CUDA process pays for loading the libraries from disk
#   RUN_TIMEOUT=s how long the reference run may take (default 1800)
#   ARGS="..."    more arguments for the program, such as "--limit 1024" for a short try on a CPU,
#                 or "--trace-steps 40 --trace-stacks 1" to see where a slow first epoch goes
# While it runs, nvidia-smi dmon samples the GPU's utilisation and memory every second (dmon.log).
# Exit status: 0 when every check passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
BIN=$(realpath -m "${BIN:-bin/gpu}")
DATA=$(realpath -m "${DATA:-/usr/share/datasets/fashion-mnist}")
EPOCHS=${EPOCHS:-10}
OUTDIR=$(realpath -m "${OUTDIR:-.durabletrain/gpu-check}")
PYTHON=$(command -v "${PYTHON:-python3}") || { echo "gpu-check: no python3" >&2; exit 1; }
PORT=${PORT:-17233}
METRICS=${METRICS_PORT:-19464}

rm -rf "$OUTDIR" && mkdir -p "$OUTDIR" "$BIN"
report=$OUTDIR/report.md
rows=()
failed=0
row() { # check, result (pass/FAIL/skip), detail
  rows+=("| $1 | $2 | $3 |")
  [ "$2" = FAIL ] && failed=1
  echo "gpu-check: $1: $2: $3"
}
t0=$(date +%s.%N)
since() { "$PYTHON" -c "import sys,time; print('%.1f s' % (time.time()-float(sys.argv[1])))" "$1"; }

# Binaries: carried ones where given, else built (the devserver compiles the
# Temporal server: minutes, the first time).
for b in devserver worker starter; do
  [ -x "$BIN/$b" ] || go build -o "$BIN/$b" "./cmd/$b" || { echo "gpu-check: cannot build $b" >&2; exit 1; }
done
# gpuworker.test is optional where no go can build it (a lent machine whose
# working tree has no room for it): check 2 is then skipped.
if [ ! -x "$BIN/gpuworker.test" ] && command -v go >/dev/null; then
  go test -c -o "$BIN/gpuworker.test" ./gpuworker || exit 1
fi

# The same program launched by hand on one GPU, no durabletrain: check 5 runs
# it for DIRECT_EPOCHS epochs, twice: while the worker is still up (its NVML
# open, sampled every 2 s) and after it stopped, and DIRECT_FIRST runs it
# before everything. Its epoch times beside the run's (0 skips it).
by_hand() { # label, log name, epochs
  mkdir -p "$OUTDIR/scratch"
  (cd "$OUTDIR/scratch" && RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((PORT + 7)) \
    CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=4 PYTHONPATH=$root/python DURABLETRAIN_EPOCHS=$3 \
    timeout 600 "$PYTHON" "$root/examples/pytorch/resnet18_fashion_mnist.py" --data "$DATA" --checkpoint-dir direct-ckpt ${ARGS:-}) \
    >"$OUTDIR/$2" 2>&1
  local direct
  direct=$("$PYTHON" - "$OUTDIR/$2" "$OUTDIR/progress.json" <<'EOF'
import json, sys
d = [json.loads(l.split(": ", 1)[1]) for l in open(sys.argv[1]) if l.startswith("epoch ")]
try:
    r = json.load(open(sys.argv[2]))["metrics"]
except Exception:
    r = []
if not d:
    print("FAIL\tthe program launched by hand reported no epoch"); sys.exit()
n = min(len(d), len(r))
med = lambda xs: sorted(xs)[len(xs) // 2]
epochs = lambda ms, first: ", ".join("%.1f (%.1f)" % (m["seconds"], first(m)) for m in ms)
line = "%d epoch(s) by hand, seconds (first step): %s" % (len(d), epochs(d, lambda m: m.get("first_step_seconds", 0)))
if n:
    line += "; the run's first %d: %s; ratio of medians %.3f" % (
        n, epochs(r[:n], lambda m: (m.get("other") or {}).get("first_step_seconds", 0)),
        med([m["seconds"] for m in r[:n]]) / med([m["seconds"] for m in d]))
print("pass\t" + line)
EOF
)
  row "$1" "${direct%%$'\t'*}" "${direct#*$'\t'}"
}
# 1. The GPUs.
dmon=
stop_dmon() { [ -n "$dmon" ] && kill "$dmon" 2>/dev/null; dmon=; }
if command -v nvidia-smi >/dev/null; then
  nvidia-smi dmon -s um -d 1 -o T >"$OUTDIR/dmon.log" 2>&1 &
  dmon=$!
  trap stop_dmon EXIT
fi
if smi=$(nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader 2>&1); then
  gpus=$(printf '%s\n' "$smi" | grep -c .)
  row "GPUs (nvidia-smi)" pass "$gpus: $(printf '%s\n' "$smi" | cut -d, -f2,4,5 | sort | uniq -c | tr -s ' ' | paste -sd';')"
else
  gpus=0
  row "GPUs (nvidia-smi)" FAIL "nvidia-smi: $(printf '%s' "$smi" | head -1)"
fi

if [ "${DIRECT_FIRST:-0}" -gt 0 ] && [ "$gpus" -gt 0 ]; then
  by_hand "by hand, before anything else" direct-first.log "$DIRECT_FIRST"
fi

# 2. NVML through the worker's code.
if [ ! -x "$BIN/gpuworker.test" ]; then
  row "NVML slots, readings, health" skip "no $BIN/gpuworker.test, and no go to build it"
else
  "$BIN/gpuworker.test" -test.run '^TestOnRealGPU$' -test.v >"$OUTDIR/nvml.log" 2>&1
  rc=$?
  slots=$(grep -c 'slot [0-9]*: ' "$OUTDIR/nvml.log")
  detail=$(grep -o 'slot 0: .*' "$OUTDIR/nvml.log" | head -1)
  if grep -q -- '--- SKIP' "$OUTDIR/nvml.log"; then
    row "NVML slots, readings, health" FAIL "NVML found no GPU ($(grep -o '"reason": "[^"]*' "$OUTDIR/nvml.log" | head -1 | cut -d'"' -f4))"
  elif [ $rc = 0 ] && [ "$slots" = "$gpus" ]; then
    row "NVML slots, readings, health" pass "$slots slot(s), all healthy; $detail"
  else
    row "NVML slots, readings, health" FAIL "exit $rc, $slots slot(s) for $gpus GPU(s); see nvml.log"
  fi
fi

# 3. NCCL.
if timeout 300 "$PYTHON" scripts/nccl_check.py >"$OUTDIR/nccl.md" 2>"$OUTDIR/nccl.log"; then
  world=$(grep -o '[0-9]* rank(s)' "$OUTDIR/nccl.md")
  big=$(grep '^| 268435456 ' "$OUTDIR/nccl.md" | awk -F'|' '{gsub(/ /, "", $4); gsub(/^ +| +$/, "", $5); printf "algbw %s GB/s, busbw %s", $4, $5}')
  row "NCCL all-reduce" pass "$(head -1 "$OUTDIR/nccl.md" | cut -d, -f1), $world, 256 MiB: $big"
else
  row "NCCL all-reduce" FAIL "$(tail -1 "$OUTDIR/nccl.log")"
fi

# 4. The reference run through durabletrain.
pids=()
# Only its own: a bare wait would wait for dmon too, which runs until stopped.
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait "${pids[@]}" 2>/dev/null; }
trap 'cleanup; stop_dmon' EXIT
"$BIN/devserver" -db "" -port "$PORT" -ui-port 0 >"$OUTDIR/devserver.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 200); do grep -q "frontend on" "$OUTDIR/devserver.log" && break; sleep 0.1; done
# The reference ran 4 GPUs at 128 each: as many ranks here, where there are 4.
workers=${WORKERS:-$((gpus >= 4 ? 4 : (gpus > 0 ? gpus : 1)))}
DURABLETRAIN_PYTHONPATH=$root/python "$BIN/worker" -address "127.0.0.1:$PORT" -role both -identity gpu-host \
  -storage-roots "file://$OUTDIR/,file://$DATA/" -allow-exec "$PYTHON" -exec-dirs "$OUTDIR" \
  -metrics-listen "127.0.0.1:$METRICS" >"$OUTDIR/worker.log" 2>&1 &
pids+=($!)
mkdir -p "$OUTDIR/scratch"
cat >"$OUTDIR/spec.json" <<EOF
{
  "name": "resnet18-fashion-mnist",
  "trainer": "exec",
  "exec": {"command": ["$PYTHON", "$root/examples/pytorch/resnet18_fashion_mnist.py", "--data", "$DATA"$(for a in ${ARGS:-}; do printf ', "%s"' "$a"; done)],
           "env": {"OMP_NUM_THREADS": "4"}, "dir": "$OUTDIR/scratch"},
  "dataset": {"url": "file://$DATA", "format": "idx"},
  "hyper": {"epochs": $EPOCHS},
  "scaling": {"workers": $workers, "workers_per_host": $workers, "gang_timeout": "2m"},
  "checkpoint": {"url": "file://$OUTDIR/checkpoints?create_dir=1", "every_steps": ${EVERY_STEPS:-200}, "keep_last": 2}
}
EOF
id=resnet18-gpu-check
run_start=$(date +%s.%N)
timeout "${RUN_TIMEOUT:-1800}" "$BIN/starter" train -address "127.0.0.1:$PORT" -f "$OUTDIR/spec.json" -id "$id" -wait >"$OUTDIR/starter.log" 2>&1 &
starter=$!
# While it trains: the ranks' heartbeats and the worker's gauges, every 2 s.
while kill -0 $starter 2>/dev/null; do
  sleep 2
  { date +%T; "$BIN/starter" status -address "127.0.0.1:$PORT" -id "$id" 2>&1; } >>"$OUTDIR/status.log"
  { date +%T; "$PYTHON" -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$METRICS/metrics', timeout=2).read().decode())" 2>&1 | grep '^durabletrain_gpu'; } >>"$OUTDIR/metrics.log"
done
wait $starter
rc=$?
run_time=$(since "$run_start")
"$BIN/starter" status -address "127.0.0.1:$PORT" -id "$id" -json >"$OUTDIR/progress.json" 2>&1

pinned=$(grep -o 'CUDA_VISIBLE_DEVICES=[^"]*' "$OUTDIR/worker.log" | head -1)
case "$pinned" in
*"backend nccl, device cuda"*) row "CUDA_VISIBLE_DEVICES in the program" pass "${pinned//|//}" ;;
*) row "CUDA_VISIBLE_DEVICES in the program" FAIL "${pinned:-the program never said}" ;;
esac
beats=$(grep -c 'gpu_utilization_percent' "$OUTDIR/status.log")
peak=$(grep -o '"gpu_utilization_percent":[0-9]*' "$OUTDIR/status.log" | cut -d: -f2 | sort -n | tail -1)
mem=$(grep -o '"gpu_memory_used_bytes":[0-9]*' "$OUTDIR/status.log" | cut -d: -f2 | sort -n | tail -1)
if [ "$beats" -gt 0 ]; then
  row "NVML readings in heartbeats" pass "$beats heartbeat(s) read with GPU readings; peak utilization ${peak}%, memory used up to $((${mem:-0} >> 20)) MiB; gauges: $(grep -c durabletrain_gpu_utilization "$OUTDIR/metrics.log") scrape line(s)"
else
  row "NVML readings in heartbeats" FAIL "no heartbeat carried GPU readings (status.log)"
fi
summary=$("$PYTHON" - "$OUTDIR/progress.json" "$EPOCHS" <<'EOF'
import json, sys
try:
    p = json.load(open(sys.argv[1]))
except Exception as e:
    print("FAIL\tno progress: %s" % e); sys.exit()
ms = p.get("metrics") or []
want = int(sys.argv[2])
if p.get("state") != "completed" or len(ms) != want:
    print("FAIL\tstate %s after %d of %d epochs" % (p.get("state"), len(ms), want)); sys.exit()
acc = ms[-1]["test_accuracy"]
secs = sorted(m.get("seconds", 0) for m in ms)
ok = acc >= 0.8976 or want < 10
print("%s\t%d epochs, test accuracy %.4f (reference 0.8976 on 4 GPUs), epoch median %.1f s (min %.1f, max %.1f, first included)"
      % ("pass" if ok else "FAIL", len(ms), acc, secs[len(secs) // 2], secs[0], secs[-1]))
for m in ms:
    o = m.get("other") or {}
    print("epoch\t%d\t%.4f\t%.4f\t%.2f\t%.2f\t%.2f" % (m["epoch"], m["test_accuracy"], m["train_loss"], m.get("seconds", 0), o.get("train_seconds", 0), o.get("first_step_seconds", 0)))
EOF
)
result=$(printf '%s\n' "$summary" | head -1)
row "reference ResNet-18 run (exit $rc)" "${result%%$'\t'*}" "${result#*$'\t'}, wall $run_time"
DIRECT_EPOCHS=${DIRECT_EPOCHS:-2}
run_by_hand=$([ "$DIRECT_EPOCHS" -gt 0 ] && [ "$gpus" -gt 0 ] && echo 1)
[ -n "$run_by_hand" ] && by_hand "by hand, the worker still up" direct-worker-up.log "$DIRECT_EPOCHS"
cleanup
trap stop_dmon EXIT
[ -n "$run_by_hand" ] && by_hand "by hand, no worker" direct.log "$DIRECT_EPOCHS"
stop_dmon

{
  echo "# scripts/gpu-check.sh on $(hostname), $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| check | result | detail |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Reference run, each epoch (from the run's progress):"
  echo
  echo "| epoch | test accuracy | train loss | seconds | training seconds | first step seconds |"
  echo "|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "$summary" | grep '^epoch' | awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s |\n", $2, $3, $4, $5, $6, $7}'
  echo
  cat "$OUTDIR/nccl.md"
  echo
  echo "Total: $(since "$t0"). Logs in $OUTDIR."
} >"$report"
cat "$report"
exit $failed
