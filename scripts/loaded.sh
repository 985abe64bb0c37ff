#!/usr/bin/env bash
# Runs a command with a CPU-bound process per core beside it, as the
# benchmarks' "loaded" sittings do, and stops them after:
#   scripts/loaded.sh make test
# A test that passes quiet and fails here assumed an idle machine.
set -euo pipefail
n=$(nproc)
pids=()
for _ in $(seq "$n"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
echo "loaded: $n CPU-bound processes beside: $*" >&2
"$@"
