"""Fashion-MNIST MLP (784-256-128-10 by default) with DistributedDataParallel.

Through durabletrain (spec trainer "exec", exec.command ["python3", "train.py"]):
the worker sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
CUDA_VISIBLE_DEVICES, restores the checkpoint directory before starting, and
asks for one epoch at a time; within an epoch the gang may stop at any step
(checkpoint.every_steps, or a worker shutting down): every rank saves there
(save()) and the run resumes at that step, on exactly the samples not yet
trained (durabletrain.ShardSampler). By hand, with plain torchrun-style
variables:

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
    p.add_argument("--checkpoint-dir", default=os.path.join(dt.scratch_dir(), "ckpt-%(rank)s"),
                   help="where this rank saves (default: in its own directory, DURABLETRAIN_SCRATCH_DIR)")
    p.add_argument("--zero", action="store_true", help="shard Adam's state over the ranks (ZeroRedundancyOptimizer); checkpoint.sharded saves each rank's part")
    p.add_argument("--report-every", type=int, default=50, help="report the running train_loss every this many steps (0: never)")
    a = p.parse_args()
    config = dt.config()
    lr = float(config.get("lr", a.lr))
    batch_size = int(config.get("batch_size", a.batch_size))
    seed = int(config.get("seed", a.seed))
    hidden = [int(w) for w in config.get("hidden", [int(w) for w in a.hidden.split(",") if w])]

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(dt.backend())  # NCCL on a GPU slot, gloo on a CPU one
    rank, world = dist.get_rank(), dist.get_world_size()
    device = dt.device()

    torch.manual_seed(seed)
    layers, width = [], 784
    for w in hidden:
        layers += [nn.Linear(width, w), nn.ReLU()]
        width = w
    model = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
    if a.zero:
        # ZeRO stage 1: each rank keeps Adam's state for its own part of the
        # parameters only, so each rank's checkpoint is its own shard (run
        # with checkpoint.sharded: every rank's directory is saved).
        from torch.distributed.optim import ZeroRedundancyOptimizer
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
        opt, local = zero, zero.optim
    else:
        opt = local = torch.optim.Adam(model.parameters(), lr=lr)
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "test")
    # This rank's samples of each epoch, as DistributedSampler(drop_last=True)
    # orders them; resumed mid-epoch, only those not yet trained.
    sampler = dt.ShardSampler(len(xtr), batch_size=batch_size, seed=seed)
    out_dir = a.checkpoint_dir % {"rank": rank}
    # The epoch under way: its loss so far, and the steps it was summed over
    # (saved mid-epoch, so a resumed epoch reports what an unbroken one does).
    run = {"loss_sum": 0.0, "loss_steps": 0}

    ckpt = dt.get_checkpoint()
    if ckpt:
        # Tensors only, loaded with weights_only=True: a checkpoint is data,
        # and unpickling arbitrary objects from it would run its code. The
        # rest (where it stands, the optimizer's hyperparameters) is JSON.
        state = torch.load(os.path.join(ckpt, "state.pt"), map_location=device, weights_only=True)
        with open(os.path.join(ckpt, "meta.json")) as f:
            meta = json.load(f)
        if (meta["epoch"], meta.get("step", 0)) != (ckpt.epoch, ckpt.step):
            raise SystemExit("train.py: %s holds epoch %s step %s, but the worker resumes at epoch %d step %d"
                             % (ckpt, meta["epoch"], meta.get("step", 0), ckpt.epoch, ckpt.step))
        model.load_state_dict(state["model"])
        if meta.get("rank", rank) != rank or meta.get("world", world) != world:
            raise SystemExit("train.py: %s is rank %s of %s's part; this is rank %d of %d" % (ckpt, meta.get("rank"), meta.get("world"), rank, world))
        local.load_state_dict({"state": state["optimizer_state"], "param_groups": meta["param_groups"]})
        if ckpt.step > 0:
            run["loss_sum"], run["loss_steps"] = meta["loss_sum"], meta["loss_steps"]
        print("rank %d: resumed from %s at epoch %d step %d" % (rank, ckpt, ckpt.epoch, ckpt.step), file=sys.stderr)
    ddp = DDP(model)

    def save_at(epoch, step):
        """This rank's whole state, at step of epoch, in out_dir."""
        os.makedirs(out_dir, exist_ok=True)
        optim = local.state_dict()  # with --zero, this rank's part of the optimizer only
        torch.save({"model": model.state_dict(), "optimizer_state": optim["state"]}, os.path.join(out_dir, "state.pt"))
        meta = {"epoch": epoch, "step": step, "param_groups": optim["param_groups"], "config": config}
        if a.zero:
            meta.update(rank=rank, world=world)
        if step > 0:
            # Every rank saves at this step: the gang's mean loss so far is
            # the same on all of them (and sums as theirs did at the end).
            total = torch.tensor([run["loss_sum"]], dtype=torch.float64, device=device)
            dist.all_reduce(total)
            run["loss_sum"] = total.item() / world
            meta.update(run)
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump(meta, f)
        return out_dir

    def save():  # asked mid-epoch, at the step the gang stopped at
        return save_at(*dt.position())

    for epoch in dt.epochs():
        start = time.time()
        sampler.set_epoch(epoch)
        shard = list(sampler)
        if dt.start_step() == 0:
            run["loss_sum"], run["loss_steps"] = 0.0, 0
        samples = 0
        batches = [torch.tensor(shard[i:i + batch_size]) for i in range(0, len(shard), batch_size)]
        ddp.train()
        for step, idx in dt.steps(batches, save=save):
            x, y = xtr[idx].to(device), ytr[idx].to(device)
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            run["loss_sum"] += loss.item()
            run["loss_steps"] += 1
            samples += len(idx) * world
            if a.report_every and (step + 1) % a.report_every == 0:
                dt.report({"train_loss": run["loss_sum"] / run["loss_steps"]})
        # Every rank scores its slice of the test set; the sums make the whole.
        ddp.eval()
        lo, hi = rank * len(xte) // world, (rank + 1) * len(xte) // world
        with torch.no_grad():
            logits = model(xte[lo:hi].to(device))
            sums = torch.tensor([F.cross_entropy(logits, yte[lo:hi].to(device), reduction="sum").item(),
                                 (logits.argmax(1).cpu() == yte[lo:hi]).sum().item(), float(hi - lo), run["loss_sum"]],
                                dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        test_loss, correct, examples, loss_sum = sums.tolist()
        train_loss = loss_sum / world / max(1, run["loss_steps"])
        dt.report({"train_loss": train_loss, "test_loss": test_loss / examples,
                   "test_accuracy": correct / examples, "test_examples": examples, "samples": samples,
                   "seconds": time.time() - start}, checkpoint_dir=save_at(epoch + 1, 0))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
