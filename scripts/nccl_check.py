"""An NCCL all-reduce across every GPU this machine shows, one process per
GPU, as scripts/gpu-check.sh runs it: each rank fills its buffer with
rank + 1, the sum is checked on every rank, and each size is timed (a median
of 20 after 5 warm-ups). busbw is nccl-tests' bus bandwidth, algbw x
2(n-1)/n; with one GPU NCCL has no peer and only algbw means anything.

    python3 scripts/nccl_check.py            # prints one row per size
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [4 << 10, 1 << 20, 16 << 20, 256 << 20]


def rank_main(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    want = world * (world + 1) / 2
    rows = []
    for size in SIZES:
        x = torch.empty(size // 4, dtype=torch.float32, device="cuda")
        times = []
        for i in range(25):
            x.fill_(rank + 1)
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            if i >= 5:
                times.append(time.perf_counter() - start)
            if not torch.all(x == want):
                raise SystemExit("nccl_check: rank %d, %d bytes: the sum is wrong (want %g everywhere)" % (rank, size, want))
        t = statistics.median(times)
        algbw = size / t / 1e9
        rows.append((size, t * 1e6, algbw, algbw * 2 * (world - 1) / world))
    if rank == 0:
        out.put((world, torch.cuda.get_device_name(0), torch.cuda.nccl.version(), rows))
    dist.destroy_process_group()


def main():
    world = torch.cuda.device_count()
    if world == 0:
        raise SystemExit("nccl_check: no GPU visible to torch")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=rank_main, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit("nccl_check: a rank failed (exit codes %s)" % [p.exitcode for p in procs])
    world, name, version, rows = out.get(timeout=5)
    print("NCCL %s all-reduce, %d rank(s) on %s, sums checked on every rank" % (".".join(map(str, version)) if isinstance(version, tuple) else version, world, name))
    print("| bytes | median time (us) | algbw (GB/s) | busbw (GB/s) |")
    print("|---:|---:|---:|---:|")
    for size, us, algbw, busbw in rows:
        print("| %d | %.1f | %.2f | %s |" % (size, us, algbw, "%.2f" % busbw if world > 1 else "n/a (1 rank)"))
    if world == 1:
        print("one GPU: NCCL ran with no peer; an all-reduce between two ranks needs two GPUs", file=sys.stderr)


if __name__ == "__main__":
    main()
