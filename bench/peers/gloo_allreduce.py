# Peer for `bench allreduce`: torch.distributed's gloo all-reduce, timed the
# way bench times ours. One process per rank; RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT in the environment; sizes in bytes and iteration counts as args.
import json, os, sys, time
import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
for arg in sys.argv[1:]:
    size, iters = (int(v) for v in arg.split(":"))
    buf = torch.ones(size // 4, dtype=torch.float32)
    for _ in range(max(2, iters // 10)):
        dist.all_reduce(buf)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    elapsed = time.perf_counter() - t0
    print(json.dumps({"rank": rank, "bytes": size, "iters": iters, "seconds": elapsed}), flush=True)
dist.destroy_process_group()
