# Peer for `bench train`: the same MLP, data, batch and optimizer as the native
# trainer, in PyTorch. One process, or one per rank with DDP over gloo when
# WORLD_SIZE > 1 (RANK, MASTER_ADDR, MASTER_PORT in the environment).
# Prints one JSON line per epoch from rank 0.
import argparse, gzip, json, os, time
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--threads", type=int, default=1)
a = p.parse_args()
torch.set_num_threads(a.threads)

def idx(name, offset):
    with gzip.open(os.path.join(a.data, name)) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)

X = torch.from_numpy(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255)
Y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
TX = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255)
TY = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    dist.init_process_group("gloo", init_method="env://")
torch.manual_seed(a.seed)
model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
if world > 1:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(model.parameters(), lr=a.lr)
n = len(Y)
for epoch in range(a.epochs):
    perm = torch.from_numpy(np.random.default_rng([a.seed, epoch]).permutation(n))
    shard = perm[rank : world * (n // world) : world]  # DistributedSampler(drop_last=True)
    model.train()
    t0 = time.perf_counter()
    losses = []
    for i in range(0, len(shard), a.batch):
        b = shard[i : i + a.batch]
        opt.zero_grad()
        loss = F.cross_entropy(model(X[b]), Y[b])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - t0
    model.eval()
    lo, hi = rank * len(TY) // world, (rank + 1) * len(TY) // world
    with torch.no_grad():
        out = model(TX[lo:hi])
        sums = torch.tensor([F.cross_entropy(out, TY[lo:hi], reduction="sum").item(), (out.argmax(1) == TY[lo:hi]).sum().item(), hi - lo], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(sums)
    if rank == 0:
        print(json.dumps({"epoch": epoch, "train_loss": sum(losses) / len(losses), "test_loss": sums[0].item() / sums[2].item(),
                          "test_accuracy": sums[1].item() / sums[2].item(), "seconds": seconds,
                          "samples_per_second": len(shard) * world / seconds}), flush=True)
if world > 1:
    dist.destroy_process_group()
