#!/usr/bin/env bash
# An experiment for BENCHMARKS.md ("4 ranks over TCP: the ring's order in four steps"), not part
# of the product: 4 ranks over loopback TCP, idle, in rounds; each round runs, one after the
# other, our ring (`bench allreduce-rank`, transport=tcp), the C ring and the four-step schedule
# (ring_order4.c), the pipelined four-step schedule (ring_order4_pipelined.c) and OpenMPI over TCP
# (mpi_allreduce.c, as `bench allreduce` runs it); each column is the slowest rank's mean µs per
# operation. Needs `make deps-bench`. Usage: rounds.sh SIZE ITERS ROUNDS
set -euo pipefail
size=$1 iters=$2 rounds=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -o "$work/ring_order4" "$here/ring_order4.c"
gcc -O2 -o "$work/pipelined" "$here/ring_order4_pipelined.c"
mpicc -O2 -o "$work/mpi_allreduce" "$here/../mpi_allreduce.c"
(cd "$here/../../.." && go build -tags openblas -o "$work/bench" ./bench)
slowest() { awk '{print $6}' | sort -n | tail -1; }
# port: the first of four consecutive loopback ports that are free now (below the ephemeral range)
port() {
	python3 -c '
import random, socket
while True:
    p = random.randrange(20000, 32000, 4)
    try:
        for q in range(p, p + 4):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass'
}
ours() {
	local p; p=$(port)
	local addrs="127.0.0.1:$p,127.0.0.1:$((p + 1)),127.0.0.1:$((p + 2)),127.0.0.1:$((p + 3))"
	for r in 0 1 2 3; do OPENBLAS_NUM_THREADS=1 "$work/bench" allreduce-rank $r "$addrs" transport=tcp "$size:$iters" & done |
		python3 -c "import sys, json; print(round(max(json.loads(l)['seconds'] for l in sys.stdin if l.startswith('{')) / $iters * 1e6, 1))"
}
c() { local p; p=$(port); for r in 0 1 2 3; do "$work/$1" $r "$p" "$size" "$iters" ${2:-} & done | slowest; }
mpi() {
	mpirun --allow-run-as-root --oversubscribe -np 4 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
		"$work/mpi_allreduce" "$size:$iters" 2>/dev/null |
		python3 -c "import sys, json; print(round(max(json.loads(l)['seconds'] for l in sys.stdin if l.startswith('{')) / $iters * 1e6, 1))"
}
echo "round ours C-ring C-four-steps C-four-steps-pipelined OpenMPI"
for k in $(seq 1 "$rounds"); do
	echo "$k $(ours) $(c ring_order4 ring) $(c ring_order4 halve) $(c pipelined) $(mpi)"
done
