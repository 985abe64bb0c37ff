#!/usr/bin/env bash
# The README's main job: an embedded Temporal dev server with the Web UI, two
# worker processes, and a 2-rank, 10-epoch Fashion-MNIST run driven by the
# starter. Everything stops at the end unless KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=bin
state=.durabletrain
tags=${TAGS:-openblas}
mkdir -p "$bin" "$state"
echo "demo: building devserver (the first build compiles the Temporal server: several minutes), worker and starter"
go build -o "$bin/devserver" ./cmd/devserver
go build -tags "$tags" -o "$bin/worker" ./cmd/worker
go build -o "$bin/starter" ./cmd/starter

pids=()
cleanup() {
  if [ "${KEEP:-}" = 1 ]; then
    echo "demo: KEEP=1: server and workers keep running (pids ${pids[*]}); stop them with: kill ${pids[*]}"
    return
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

port=${PORT:-7233}
ui=${UI_PORT:-8233}
"$bin/devserver" -db "$state/temporal.db" -port "$port" -ui-port "$ui" > "$state/devserver.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q "frontend on" "$state/devserver.log" 2>/dev/null && break; sleep 0.1; done
cat "$state/devserver.log"
if ! grep -q "frontend on" "$state/devserver.log" || ! kill -0 "${pids[0]}" 2>/dev/null; then
  echo "demo: the dev server did not start (is port $port or $ui taken? set PORT= and UI_PORT=)" >&2
  exit 1
fi

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
for w in a b; do
  role=agent; [ "$w" = a ] && role=both
  "$bin/worker" -address "127.0.0.1:$port" -role "$role" -slots 1 -identity "worker-$w" \
    -storage-roots "$PWD/$state/,/usr/share/datasets/" > "$state/worker-$w.log" 2>&1 &
  pids+=($!)
done
echo "demo: workers worker-a (workflows + 1 slot) and worker-b (1 slot) started; logs in $state/"
echo "demo: watch it in the Temporal Web UI at http://127.0.0.1:$ui"
id="demo-$(date +%Y%m%d-%H%M%S)"
"$bin/starter" train -address "127.0.0.1:$port" -id "$id" -workers 2 -epochs 10 \
  -checkpoint "$PWD/$state/checkpoints" -search-attributes -wait
"$bin/starter" checkpoints -address "127.0.0.1:$port" -id "$id"
