"""The reference run the product was conceived from, through durabletrain:
Ray Train's image classification example (torchvision ResNet-18 with a
one-channel stem, Fashion-MNIST normalised to mean 0.5 and deviation 0.5,
batches of 128 per rank, Adam at lr 0.001, 10 epochs; 0.8976 test accuracy
on 4 GPUs in the reference).

As an exec run (spec trainer "exec"), one process per rank:

    {"trainer": "exec",
     "exec": {"command": ["python3", "examples/pytorch/resnet18_fashion_mnist.py"]},
     "hyper": {"epochs": 10}, "scaling": {"workers": 4},
     "checkpoint": {"every_steps": 100}}

Each rank trains its shard (durabletrain.ShardSampler, DistributedSampler's
order) with DistributedDataParallel (NCCL on GPUs, gloo on CPUs), and the
gang may stop at any step: every rank saves there and the run resumes there.
Unlike the reference, which scores each rank's quarter of the test set, the
test accuracy reported is over the whole test set (the ranks' sums). By
hand: RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
PYTHONPATH=../../python DURABLETRAIN_EPOCHS=1 python3 resnet18_fashion_mnist.py

--limit trains on the first N training images (the CI's one short epoch on
CPU); the run's config (durabletrain.config()) may set lr, batch_size, seed.
To find where a slow start goes, --trace-steps N prints how long the
start-up's phases and each epoch's first N steps took (rank 0), and
--trace-stacks S has every rank print every thread's Python stack every S
seconds until its first epoch's N-th step (or that epoch's end).
Needs torch, torchvision (Debian's python3-torchvision) and the standard library.
"""

import argparse
import faulthandler
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
from torchvision.models import resnet18

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import durabletrain as dt  # noqa: E402

BEGAN = time.time()  # after the imports: torch's is most of a start-up


def process_began():
    """When this process started (Linux's /proc), else when the imports ended."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return time.time() - up + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return BEGAN


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2049:
        return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()
    rows, cols = struct.unpack(">II", data[8:16])
    return torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8).reshape(n, 1, rows, cols)


def load(data, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data, prefix + "-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data, prefix + "-labels-idx1-ubyte.gz"))
    # ToTensor() then Normalize((0.5,), (0.5,)), as the reference.
    return (x.float() / 255 - 0.5) / 0.5, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=0, help="train on the first N images only (0: all)")
    p.add_argument("--checkpoint-dir", default=os.path.join(dt.scratch_dir(), "resnet18-ckpt-%(rank)s"),
                   help="where this rank saves (default: in its own directory, DURABLETRAIN_SCRATCH_DIR)")
    p.add_argument("--report-every", type=int, default=50)
    p.add_argument("--trace-steps", type=int, default=0, help="print the times of each epoch's first N steps (rank 0)")
    p.add_argument("--trace-stacks", type=float, default=0,
                   help="dump every thread's stack every S seconds until the first epoch's N-th step (every rank)")
    a = p.parse_args()
    phases = [("imports", BEGAN)]

    def phase(name):  # the start-up's phases, for --trace-steps
        phases.append((name, time.time()))

    dumping = a.trace_stacks > 0  # stacks every S seconds, until the first epoch's N-th step
    if dumping:
        faulthandler.dump_traceback_later(a.trace_stacks, repeat=True, file=sys.stderr)

    def stop_dumping():
        nonlocal dumping
        if dumping:
            faulthandler.cancel_dump_traceback_later()
            dumping = False
    config = dt.config()
    lr = float(config.get("lr", a.lr))
    batch_size = int(config.get("batch_size", a.batch_size))
    seed = int(config.get("seed", a.seed))

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(dt.backend())  # NCCL on a GPU slot, gloo on a CPU one
    phase("init_process_group")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = dt.device()
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
    # The slot's pinning as the program sees it (scripts/gpu-check.sh reads this line).
    print("rank %d of %d: CUDA_VISIBLE_DEVICES=%s, backend %s, device %s%s" % (
        rank, world, os.environ.get("CUDA_VISIBLE_DEVICES", ""), dist.get_backend(), device,
        " (%s, %d visible)" % (torch.cuda.get_device_name(device), torch.cuda.device_count()) if cuda else ""),
        file=sys.stderr)

    torch.manual_seed(seed)
    model = resnet18(num_classes=10)
    # The original ResNet takes 3-channel images; Fashion-MNIST has one.
    model.conv1 = nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    phase("model on the device")

    xtr, ytr = load(a.data, "train")
    if a.limit:
        xtr, ytr = xtr[:a.limit], ytr[:a.limit]
    xte, yte = load(a.data, "test")
    phase("data loaded")
    sampler = dt.ShardSampler(len(xtr), batch_size=batch_size, seed=seed)
    out_dir = a.checkpoint_dir % {"rank": rank}
    run = {"loss_sum": 0.0, "loss_steps": 0}

    ckpt = dt.get_checkpoint()
    if ckpt:
        state = torch.load(os.path.join(ckpt, "state.pt"), map_location=device, weights_only=True)
        with open(os.path.join(ckpt, "meta.json")) as f:
            meta = json.load(f)
        if (meta["epoch"], meta["step"]) != (ckpt.epoch, ckpt.step):
            raise SystemExit("resnet18: %s holds epoch %s step %s, but the worker resumes at epoch %d step %d"
                             % (ckpt, meta["epoch"], meta["step"], ckpt.epoch, ckpt.step))
        model.load_state_dict(state["model"])
        opt.load_state_dict({"state": state["optimizer_state"], "param_groups": meta["param_groups"]})
        if ckpt.step > 0:
            run["loss_sum"], run["loss_steps"] = meta["loss_sum"], meta["loss_steps"]
        print("rank %d: resumed from %s at epoch %d step %d" % (rank, ckpt, ckpt.epoch, ckpt.step), file=sys.stderr)
    ddp = DDP(model)
    phase("DDP")
    trace = a.trace_steps > 0 and rank == 0

    def save_at(epoch, step):
        os.makedirs(out_dir, exist_ok=True)
        optim = opt.state_dict()
        # BatchNorm's running statistics are buffers of the state dict: saved too.
        torch.save({"model": model.state_dict(), "optimizer_state": optim["state"]}, os.path.join(out_dir, "state.pt"))
        meta = {"epoch": epoch, "step": step, "param_groups": optim["param_groups"], "config": config}
        if step > 0:
            total = torch.tensor([run["loss_sum"]], dtype=torch.float64, device=device)
            dist.all_reduce(total)
            run["loss_sum"] = total.item() / world
            meta.update(run)
        with open(os.path.join(out_dir, "meta.json"), "w") as f:
            json.dump(meta, f)
        return out_dir

    def save():
        return save_at(*dt.position())

    for epoch in dt.epochs():
        start = time.time()
        if trace and phases:
            phase("epoch %d given" % epoch)
            began = process_began()
            print("trace: start-up, seconds since the process began: %s" % (
                ", ".join("%s %.2f" % (n, t - began) for n, t in phases)), file=sys.stderr)
            phases = None
        step_times, last = [], start
        sampler.set_epoch(epoch)
        shard = list(sampler)
        if dt.start_step() == 0:
            run["loss_sum"], run["loss_steps"] = 0.0, 0
        samples, first_step = 0, 0.0
        batches = [torch.tensor(shard[i:i + batch_size]) for i in range(0, len(shard), batch_size)]
        ddp.train()
        for step, idx in dt.steps(batches, save=save):
            x, y = xtr[idx].to(device, non_blocking=True), ytr[idx].to(device, non_blocking=True)
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            run["loss_sum"] += loss.item()  # waits for the step's kernels
            run["loss_steps"] += 1
            if not samples:  # the first step, with cuDNN's autotuning on a GPU
                first_step = time.time() - start
            if len(step_times) < a.trace_steps:
                now = time.time()
                step_times.append(now - last)
                last = now
                if len(step_times) == a.trace_steps:
                    if trace:
                        print("trace: epoch %d, its first %d steps from step %d, ms each: %s" % (
                            epoch, len(step_times), step - len(step_times) + 1,
                            " ".join("%.0f" % (1000 * d) for d in step_times)), file=sys.stderr)
                    stop_dumping()
            samples += len(idx) * world
            if a.report_every and (step + 1) % a.report_every == 0:
                dt.report({"train_loss": run["loss_sum"] / run["loss_steps"]})
        train_seconds = time.time() - start
        stop_dumping()
        # Every rank scores its slice of the test set; the sums make the whole.
        model.eval()
        lo, hi = rank * len(xte) // world, (rank + 1) * len(xte) // world
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for i in range(lo, hi, 500):
                logits = model(xte[i:min(i + 500, hi)].to(device))
                target = yte[i:min(i + 500, hi)].to(device)
                loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
                correct += (logits.argmax(1) == target).sum().item()
        sums = torch.tensor([loss_sum, correct, float(hi - lo), run["loss_sum"]], dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        test_loss, correct, examples, train_sum = sums.tolist()
        metrics = {"train_loss": train_sum / world / max(1, run["loss_steps"]), "test_loss": test_loss / examples,
                   "test_accuracy": correct / examples, "test_examples": examples, "samples": samples,
                   "seconds": time.time() - start, "train_seconds": train_seconds,
                   "first_step_seconds": first_step}
        if cuda:
            metrics["gpu_max_memory_bytes"] = torch.cuda.max_memory_allocated()
        if rank == 0:
            print("epoch %d: %s" % (epoch, json.dumps(metrics)), file=sys.stderr)
        dt.report(metrics, checkpoint_dir=save_at(epoch + 1, 0))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
