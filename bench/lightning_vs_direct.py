"""Lightning through durabletrain against Lightning launched directly: `make bench-lightning`.

One Lightning program (an MLP on the whole of Fashion-MNIST, 2 ranks of DDP
over gloo, one thread each, a checkpoint at every epoch's end), timed two
ways in one sitting, in alternating order:

- direct: `python -m torch.distributed.run --standalone --nproc_per_node 2`
  on this file (torchrun: both ranks start at once, as the worker starts
  them), Lightning's own DDPStrategy and ModelCheckpoint, from launch to exit;
- durabletrain: the same module and data in a TorchTrainer's function, with
  Ray Train's changes (RayDDPStrategy, RayLightningEnvironment,
  RayTrainReportCallback, prepare_trainer), on a local cluster started once
  and warm (the embedded dev server and a worker), from fit() to its return:
  shipping the function, forming the gang, the ranks' start, every report
  and checkpoint through the worker and the workflow included.

Both sides start fresh rank processes, import torch and Lightning, read the
data and save a checkpoint per epoch. Each side's rank 0 also times its
trainer.fit() (the training itself, past the processes' start). It prints
each pair, the ratio of the medians and the spread of the pairs' ratios, end
to end and of fit(); --load adds a CPU-bound process per core beside both.

    .venv/bin/python bench/lightning_vs_direct.py --repeats 3 [--epochs 3] [--load]
"""

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time

DATA = "/usr/share/datasets/fashion-mnist"


def fashion_mnist(data):
    import numpy as np
    import torch

    def idx(name, offset):
        with gzip.open(os.path.join(data, name)) as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)

    x = torch.from_numpy(idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 784).astype(np.float32) / 255)
    y = torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    return torch.utils.data.TensorDataset(x, y)


def module():
    import lightning.pytorch as pl
    import torch

    class MLP(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return MLP()


def trainer_kwargs(epochs):
    return dict(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                enable_model_summary=False, log_every_n_steps=50)


def timed_fit(trainer, loader, fit_log):
    """trainer.fit, its wall time appended to fit_log by rank 0."""
    start = time.monotonic()
    trainer.fit(module(), train_dataloaders=loader)
    if trainer.global_rank == 0:
        with open(fit_log, "a") as f:
            f.write("%.3f %d\n" % (time.monotonic() - start, trainer.global_step))


def train_direct(epochs, data, out):
    """The program as torchrun runs it: plain Lightning DDP."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.strategies import DDPStrategy
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(fashion_mnist(data), batch_size=64, shuffle=True)
    trainer = pl.Trainer(strategy=DDPStrategy(process_group_backend="gloo"), devices=2, num_nodes=1,
                         callbacks=[ModelCheckpoint(dirpath=out, save_top_k=-1, every_n_epochs=1)], **trainer_kwargs(epochs))
    timed_fit(trainer, loader, os.path.join(out, "fit.log"))


def train_durable(config):
    """The same program with Ray Train's changes, as a TorchTrainer runs it."""
    import lightning.pytorch as pl
    import torch
    from durabletrain.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(fashion_mnist(config["data"]), batch_size=64, shuffle=True)
    trainer = pl.Trainer(strategy=RayDDPStrategy(), devices="auto", plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                         enable_checkpointing=False, **trainer_kwargs(config["epochs"]))
    trainer = prepare_trainer(trainer)
    timed_fit(trainer, loader, config["fit_log"])


def time_direct(epochs, data):
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        start = time.monotonic()
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        os.path.abspath(__file__), "--rank-direct", str(epochs), data, out], check=True, env=env, start_new_session=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        took = time.monotonic() - start
        if len([f for f in os.listdir(out) if f.endswith(".ckpt")]) != epochs:
            raise SystemExit("direct: %s holds %s; want a checkpoint per epoch" % (out, os.listdir(out)))
        fit, steps = open(os.path.join(out, "fit.log")).read().split()
        return took, float(fit), int(steps)


def time_durable(epochs, data, n):
    from durabletrain.train import RunConfig, ScalingConfig
    from durabletrain.train.torch import TorchTrainer
    fit_log = tempfile.mktemp(prefix="bench-lightning-fit-")
    t = TorchTrainer(train_durable, train_loop_config={"epochs": epochs, "data": data, "fit_log": fit_log}, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="bench-lightning-%d-%d" % (os.getpid(), n), verbose=0))
    start = time.monotonic()
    r = t.fit()
    took = time.monotonic() - start
    if r.state != "completed" or len(r.metrics_history) != epochs or r.checkpoint is None:
        raise SystemExit("durabletrain: %s" % (r.progress,))
    fit, steps = open(fit_log).read().split()
    os.remove(fit_log)
    return took, float(fit), int(steps)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--data", default=DATA)
    p.add_argument("--load", action="store_true", help="a CPU-bound process per core beside both sides")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import durabletrain
    durabletrain.init(num_cpus=2)
    # Each in a session of its own, as the direct side's processes and the cluster's are: the
    # kernel's autogroups share the CPU between sessions, so the load weighs on both sides alike.
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                for _ in range(os.cpu_count() or 1)] if a.load else []
    time_direct(1, a.data)  # warm both sides' caches (imports, page cache) once
    time_durable(1, a.data, 0)
    rows = []
    for i in range(a.repeats):
        if i % 2 == 0:
            d = time_direct(a.epochs, a.data)
            t = time_durable(a.epochs, a.data, i + 1)
        else:
            t = time_durable(a.epochs, a.data, i + 1)
            d = time_direct(a.epochs, a.data)
        if d[2] != t[2]:
            raise SystemExit("direct trained %d steps and durabletrain %d: not the same job" % (d[2], t[2]))
        rows.append((d, t))
        print("repeat %d: direct %.2f s (fit %.2f), durabletrain %.2f s (fit %.2f)" % (i + 1, d[0], d[1], t[0], t[1]), flush=True)
    for s in spinners:
        s.kill()
    print()
    print("| %s, %d epochs | direct s | through durabletrain s | ratio | direct fit() s | durabletrain fit() s | ratio |" % (
        "loaded" if a.load else "quiet", a.epochs))
    print("|---|---:|---:|---:|---:|---:|---:|")
    for i, (d, t) in enumerate(rows):
        print("| repeat %d | %.2f | %.2f | %.3f | %.2f | %.2f | %.3f |" % (i + 1, d[0], t[0], t[0] / d[0], d[1], t[1], t[1] / d[1]))
    cells = []
    for k in (0, 1):
        md, mt = statistics.median(d[k] for d, _ in rows), statistics.median(t[k] for _, t in rows)
        ratios = [t[k] / d[k] for d, t in rows]
        cells.append("%.2f | %.2f | **%.3f** (%.3f–%.3f)" % (md, mt, mt / md, min(ratios), max(ratios)))
    print("| median (spread of the pairs) | %s | %s |" % tuple(cells))
    durabletrain.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-direct":
        train_direct(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
