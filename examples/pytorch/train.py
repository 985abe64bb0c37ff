"""Fashion-MNIST MLP (784-256-128-10 by default) with DistributedDataParallel.

Through durabletrain (spec trainer "exec", exec.command ["python3", "train.py"]):
the worker sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
CUDA_VISIBLE_DEVICES, restores the checkpoint directory before starting, and
asks for one epoch at a time. By hand, with plain torchrun-style variables:

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        PYTHONPATH=../../python DURABLETRAIN_EPOCHS=3 python3 train.py

The run's config (durabletrain.config(): a search's "config.<key>" values, or
the spec's "config") overrides the flags: lr, batch_size, hidden (layer widths,
such as [256, 128]) and seed, so a search tunes this script as Ray Tune tunes a
trainable. By hand: DURABLETRAIN_CONFIG='{"lr": 0.01, "hidden": [64]}'.

NCCL on GPUs, gloo on CPUs. Needs only torch and the standard library.
"""

import argparse
import gzip
import json
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import durabletrain as dt  # noqa: E402


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2049:
        return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()
    rows, cols = struct.unpack(">II", data[8:16])
    return torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8).reshape(n, rows * cols).float() / 255


def load(data, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data, prefix + "-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data, prefix + "-labels-idx1-ubyte.gz"))
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", default="256,128", help="hidden layer widths")
    p.add_argument("--checkpoint-dir", default="ckpt-%(rank)s")
    a = p.parse_args()
    config = dt.config()
    lr = float(config.get("lr", a.lr))
    batch_size = int(config.get("batch_size", a.batch_size))
    seed = int(config.get("seed", a.seed))
    hidden = [int(w) for w in config.get("hidden", [int(w) for w in a.hidden.split(",") if w])]

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cuda = torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "") != ""
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    torch.manual_seed(seed)
    layers, width = [], 784
    for w in hidden:
        layers += [nn.Linear(width, w), nn.ReLU()]
        width = w
    model = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    ckpt = dt.get_checkpoint()
    if ckpt:
        # Tensors only, loaded with weights_only=True: a checkpoint is data,
        # and unpickling arbitrary objects from it would run its code. The
        # rest (epoch, the optimizer's hyperparameters) is JSON.
        state = torch.load(os.path.join(ckpt, "state.pt"), map_location=device, weights_only=True)
        with open(os.path.join(ckpt, "meta.json")) as f:
            meta = json.load(f)
        model.load_state_dict(state["model"])
        opt.load_state_dict({"state": state["optimizer_state"], "param_groups": meta["param_groups"]})
        print("rank %d: resumed from %s at epoch %d" % (rank, ckpt, meta["epoch"]), file=sys.stderr)
    ddp = DDP(model)

    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "test")
    n = len(xtr) // world * world  # DistributedSampler(drop_last=True)
    out_dir = a.checkpoint_dir % {"rank": rank}

    for epoch in dt.epochs():
        start = time.time()
        g = torch.Generator().manual_seed(seed * 1000003 + epoch)
        perm = torch.randperm(len(xtr), generator=g)[:n]
        shard = perm[rank::world]
        ddp.train()
        total, steps = 0.0, 0
        for i in range(0, len(shard), batch_size):
            idx = shard[i:i + batch_size]
            x, y = xtr[idx].to(device), ytr[idx].to(device)
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
            steps += 1
        # Every rank scores its slice of the test set; the sums make the whole.
        ddp.eval()
        lo, hi = rank * len(xte) // world, (rank + 1) * len(xte) // world
        with torch.no_grad():
            logits = model(xte[lo:hi].to(device))
            sums = torch.tensor([F.cross_entropy(logits, yte[lo:hi].to(device), reduction="sum").item(),
                                 (logits.argmax(1).cpu() == yte[lo:hi]).sum().item(), float(hi - lo), total, float(steps)],
                                dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        test_loss, correct, examples, loss_sum, step_sum = sums.tolist()
        os.makedirs(out_dir, exist_ok=True)
        optim = opt.state_dict()
        torch.save({"model": model.state_dict(), "optimizer_state": optim["state"]}, os.path.join(out_dir, "state.pt"))
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump({"epoch": epoch + 1, "param_groups": optim["param_groups"], "config": config}, f)
        dt.report({"train_loss": loss_sum / step_sum, "test_loss": test_loss / examples,
                   "test_accuracy": correct / examples, "test_examples": examples, "samples": len(shard) * world,
                   "seconds": time.time() - start}, checkpoint_dir=out_dir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
