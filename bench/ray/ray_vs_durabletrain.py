"""durabletrain against Ray Train itself: the same jobs both ways, side by side (`make bench-ray`).

One training function, written against Ray Train's API (``train.report``,
``train.get_checkpoint``, ``train.torch.prepare_model``,
``prepare_data_loader``), runs three ways in one sitting:

- ray: Ray Train's ``TorchTrainer`` on a local Ray (``ray.init(num_cpus=2)``),
  as its documentation runs it (``FailureConfig(max_failures=3)``);
- durabletrain: ``durabletrain.train.torch.TorchTrainer`` on a local cluster
  (``durabletrain.init()``: the embedded Temporal dev server and a worker);
- direct (the overhead job only): torchrun (``torch.distributed.run
  --standalone``) with the same function and a shim of the four calls.

The function differs between the sides in one place: resumed from a
checkpoint taken inside an epoch, Ray's side skips the batches the
checkpoint had trained itself (Ray's ``prepare_data_loader`` starts every
epoch at its beginning), while durabletrain's prepared loader starts there
on its own. Both report a checkpoint (model, optimizer, epoch, step) every
``--every`` steps and at every epoch's end: the same cadence.

Every sample is a fresh driver process that starts its side's cluster,
untimed, then times one ``fit()`` (direct: the launch to the exit), and
stops the cluster, so no side's daemons share the CPU with another's run.
The sides alternate, ``--repeats`` times. Rank 0 logs every step it trains
(time, epoch, step, process): time to the first step, steps trained twice
(lost) and time to training again after a fault are read from that log.

Jobs (``--jobs``):
  overhead  the MLP (784-256-10, all of Fashion-MNIST, batch 64, 2 epochs) with a
            checkpoint at each epoch's end (mlp) and every 50 steps too
            (mlp50), and the reference 000's ResNet-18 (a Fashion-MNIST
            subset, batch 128, a checkpoint per epoch): wall time and time
            to the first step, 2 CPU ranks;
  killed    mlp50, rank 1's process SIGKILLed mid-epoch: time from the kill
            to a step trained by a new gang, steps lost; ours with and without
            FailureConfig(warm_spares=True) (durabletrain+spares);
  hung      mlp50, rank 1's process SIGSTOPped mid-epoch: time until the run
            notices and trains again (capped at --hung-cap seconds);
  coordinator
            mlp50, the driver and every process of its cluster SIGKILLed
            mid-epoch (Ray: the driver, GCS, raylet and workers; ours: the
            driver, the Temporal server, the worker and its ranks), then the
            same script run again at once, as each side's documentation
            says (Ray Train: the same RunConfig name and storage_path; ours:
            durabletrain.init() and fit() of the same name): whether it
            completes, steps lost, time from the kill to training again;
  tpe       the same TPE search on both (Ray: OptunaSearch, Optuna's own TPE;
            ours: the search workflow's TPE, through the same OptunaSearch
            import path) over one space (the MLP's lr, weight decay, width,
            batch, optimizer, trained one epoch on 6,000 images, scored on
            2,000 others), --tpe-trials trials, 2 at a time, for each of
            --tpe-seeds: the best accuracy per seed, and wall time;
  pbt       the same population based training on both (Ray's PopulationBasedTraining,
            ours): --pbt-population trials of the MLP, --pbt-iterations iterations
            of 1,000 images each with a checkpoint, lr and momentum perturbed
            every --pbt-interval: the best and mean final accuracy, wall time;
  tunedriver
            a grid of 8 trials (6 iterations, a checkpoint each), 2 at a time: the
            script's driver and its whole cluster SIGKILLed once 3 trials have
            finished, the script run again at once, which restores the search as
            each side documents (Tuner.can_restore, Tuner.restore): whether it
            completes, iterations trained twice, wall time;
  asha      the reference 001 search (a Trainable, ConvNet on Fashion-MNIST,
            tune.run with ASHA, examples/ray_to_durabletrain) with 16 trials,
            --asha-iterations iterations each, one CPU per trial: wall time and
            the best mean_accuracy.

    .venv-ray/bin/python bench/ray/ray_vs_durabletrain.py [--jobs overhead,killed,hung] [--repeats 3]
"""

import argparse
import gzip
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

DATA = "/usr/share/datasets/fashion-mnist"
HERE = os.path.abspath(__file__)


# ---- the training function, one for every side ------------------------------------------

def fashion_mnist(data, limit, image):
    import numpy as np
    import torch

    def idx(name, offset):
        with gzip.open(os.path.join(data, name)) as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)
    x = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 784)[:limit].astype(np.float32) / 255
    y = idx("train-labels-idx1-ubyte.gz", 8)[:limit].astype(np.int64)
    x = torch.from_numpy((x - 0.5) / 0.5)
    if image:
        x = x.reshape(-1, 1, 28, 28)
    return torch.utils.data.TensorDataset(x, torch.from_numpy(y))


def build_model(kind):
    import torch
    if kind == "resnet18":
        from torchvision.models import resnet18
        m = resnet18(num_classes=10)
        m.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
        return m
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def train_loop(config):
    """The job, as a Ray Train user writes it; config["api"] names the module
    the four calls come from: ray, durabletrain, or this file's shim."""
    import torch
    api = importlib.import_module(config["api"]) if config["api"] != "direct" else _direct_api()
    train = api.train
    torch.set_num_threads(1)
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    with open(os.path.join(config["pids"], "rank-%d" % rank), "w") as f:
        f.write(str(os.getpid()))
    mark_phase(config, "entry", rank)
    torch.manual_seed(0)
    image = config["model"] == "resnet18"
    loader = torch.utils.data.DataLoader(fashion_mnist(config["data"], config["limit"], image), batch_size=config["batch"], shuffle=True)
    loader = train.torch.prepare_data_loader(loader)
    model = train.torch.prepare_model(build_model(config["model"]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    start_epoch, start_step = 0, 0
    ck = train.get_checkpoint()
    if ck:
        with ck.as_directory() as d:
            st = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start_epoch, start_step = st["epoch"], st["step"]
        if start_step >= len(loader):
            start_epoch, start_step = start_epoch + 1, 0
    mark_phase(config, "ready", rank)
    log = open(config["log"], "a", buffering=1) if rank == 0 else None

    def save(metrics, epoch, step):
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch, "step": step}, os.path.join(d, "state.pt"))
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))

    for epoch in range(start_epoch, config["epochs"]):
        loader.sampler.set_epoch(epoch)
        model.train()
        first = start_step if epoch == start_epoch else 0
        batches = iter(loader)
        if config["api"] == "ray":  # Ray's loader starts each epoch at its beginning: skip what the checkpoint trained
            for _ in range(first):
                next(batches, None)
        step = first
        for x, y in batches:
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if log:
                log.write("%.6f %d %d %d\n" % (time.time(), epoch, step, os.getpid()))
            if config["every"] and step % config["every"] == 0 and step < len(loader):
                save({"loss": loss.item(), "epoch": epoch, "step": step}, epoch, step)
        save({"loss": loss.item(), "epoch": epoch, "step": step}, epoch, step)


def mark_phase(config, phase, rank):
    """Logs when this rank's process reached phase (entry: the function
    started; ready: its data, model, process group and checkpoint loaded)."""
    with open(os.path.join(config["pids"], "phases.log"), "a") as f:
        f.write("%.6f %s %d %d\n" % (time.time(), phase, rank, os.getpid()))


def read_phases(out, since):
    """The first time after since each rank logged each phase: {phase: {rank: t}}."""
    marks = {}
    path = os.path.join(out, "phases.log")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                t, phase, rank, _ = line.split()
                if float(t) > since:
                    marks.setdefault(phase, {}).setdefault(rank, float(t))
    return marks


class _Namespace:
    pass


def _direct_api():
    """Ray Train's four calls for a torchrun launch: DDP and a
    DistributedSampler; reports keep the checkpoint on local disk."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    api, t, tt = _Namespace(), _Namespace(), _Namespace()

    class Ctx:
        def get_world_rank(self):
            return dist.get_rank()

    class Ckpt:
        @staticmethod
        def from_directory(d):
            return d

    def report(metrics, checkpoint=None):
        if checkpoint and dist.get_rank() == 0:
            dst = os.path.join(os.environ["DIRECT_OUT"], "checkpoint")
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(checkpoint, dst)
        dist.barrier()

    def prepare_data_loader(loader):
        return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=DistributedSampler(loader.dataset, shuffle=True))

    t.get_context, t.get_checkpoint, t.report, t.Checkpoint = Ctx, (lambda: None), report, Ckpt
    tt.prepare_model = lambda m: torch.nn.parallel.DistributedDataParallel(m)
    tt.prepare_data_loader = prepare_data_loader
    t.torch, api.train = tt, t
    return api


# ---- one sample: a driver process of one side -----------------------------------------------

def read_log(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) == 4:
                    rows.append((float(p[0]), int(p[1]), int(p[2]), int(p[3])))
    return rows


class Fault(threading.Thread):
    """Once rank 0 has logged `at` steps, sends sig to rank 1's process; then
    waits for a step logged by a process other than rank 0's of the time
    (the new gang), for at most cap seconds."""

    def __init__(self, log, pids, at, sig, cap):
        super().__init__(daemon=True)
        self.log, self.pids, self.at, self.sig, self.cap = log, pids, at, sig, cap
        self.killed_at = self.again_at = None
        self.done = threading.Event()

    def run(self):
        while len(read_log(self.log)) < self.at:
            time.sleep(0.01)
        rows = read_log(self.log)
        old = rows[-1][3]
        victim = int(open(os.path.join(self.pids, "rank-1")).read())
        os.kill(victim, self.sig)
        self.killed_at = time.time()
        self.victim = victim
        while time.time() - self.killed_at < self.cap:
            fresh = [r for r in read_log(self.log) if r[0] > self.killed_at and r[3] != old]
            if fresh:
                self.again_at = fresh[0][0]
                break
            time.sleep(0.02)
        self.done.set()


def job_config(job, data, out):
    base = {"data": data, "log": os.path.join(out, "steps.log"), "pids": out}
    if job == "resnet18":  # the reference 000: a checkpoint at every epoch's end
        return dict(base, model="resnet18", limit=int(os.environ.get("RESNET_LIMIT", "2048")), batch=128, epochs=2, every=0)
    # The MLP: all of Fashion-MNIST, 469 steps per rank per epoch at batch 64; "mlp" checkpoints at
    # every epoch's end, "mlp50" every 50 steps as well (the cadence the fault jobs run at).
    return dict(base, model="mlp", limit=60000, batch=64, epochs=int(os.environ.get("MLP_EPOCHS", "2")), every=50 if job == "mlp50" else 0)


def start_side(side, out):
    """Starts side's local cluster (untimed); returns its TorchTrainer and configs."""
    if side == "ray":
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        import durabletrain as ray  # noqa: F811 (the same names, durabletrain's)
        from durabletrain.train import FailureConfig, RunConfig, ScalingConfig
        from durabletrain.train.torch import TorchTrainer
        ray.init(num_cpus=2, storage=os.path.join(out, "storage"))
    return TorchTrainer, FailureConfig, RunConfig, ScalingConfig


def sample(side, job, fault, data, cap, out=None, name=None):
    """One run of job on side; returns its figures as a dict. With out and
    name given (the coordinator job's two drivers), they are the caller's."""
    keep = out is not None
    out = out or tempfile.mkdtemp(prefix="raybench-")
    name = name or "bench-%s-%d" % (job, os.getpid())
    if job == "asha":
        return asha_sample(side, out, cap)
    if job.startswith("pbt"):  # pbt:<population>:<iterations>:<interval>
        _, pop, iters, interval = job.split(":")
        return pbt_sample(side, out, int(pop), int(iters), int(interval))
    if job.startswith("tpe"):  # tpe:<seed>:<trials>
        _, seed, trials = job.split(":")
        return tpe_sample(side, out, int(seed), int(trials))
    cfg = job_config(job, data, out)
    cfg["api"] = side.split("+")[0]
    try:
        if side == "direct":
            env = dict(os.environ, OMP_NUM_THREADS="1", DIRECT_OUT=out)
            start = time.time()
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", HERE,
                            "--rank-direct", json.dumps(cfg)], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            end = time.time()
            return figures(cfg, start, end, None, "completed")
        TorchTrainer, FailureConfig, RunConfig, ScalingConfig = start_side(cfg["api"], out)
        failure = FailureConfig(max_failures=3, warm_spares=True) if side.endswith("+spares") else FailureConfig(max_failures=3)
        trainer = TorchTrainer(train_loop, train_loop_config=cfg, scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(name=name, storage_path=os.path.join(out, "storage"), failure_config=failure))
        f = None
        if fault and fault.startswith("coordinator"):
            start = time.time()
            state = _fit(trainer)
            return {"state": state, "end": time.time(), "start": start}
        if fault:
            steps = 469  # the MLP's steps per rank and epoch
            f = Fault(cfg["log"], out, steps + 75, signal.SIGKILL if fault == "killed" else signal.SIGSTOP, cap)
            f.start()
        start = time.time()
        state = "completed"
        if f is not None and fault == "hung":
            # A run that never notices is stopped at the cap: its outcome is the cap.
            res = {}
            th = threading.Thread(target=lambda: res.setdefault("r", _fit(trainer)), daemon=True)
            th.start()
            f.done.wait(cap + 600)
            if f.again_at is None:
                os.kill(f.victim, signal.SIGKILL)
                state = "not noticed in %ds" % cap
                th.join(120)
            else:
                th.join(600)
            state = res.get("r", state) if f.again_at is not None else state
        else:
            state = _fit(trainer)
        end = time.time()
        return figures(cfg, start, end, f, state)
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)


def coordinator_sample(side, data, at):
    """The coordinator job: a driver that fits, SIGKILLed with every process
    of its cluster once rank 0 has trained `at` steps, and a second driver
    of the same script, started at once, that fits the same run again."""
    out = tempfile.mkdtemp(prefix="raybench-")
    name = "bench-coordinator-%d" % os.getpid()
    marker = "RAYBENCH_SAMPLE=" + os.path.basename(out)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYBENCH_SAMPLE=os.path.basename(out), DURABLETRAIN_HOME=os.path.join(out, "home"))
    cfg = job_config("mlp50", data, out)
    cmd = [sys.executable, HERE, "--sample", side, "mlp50", "coordinator", "0", out, name]
    try:
        start = time.time()
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while len(read_log(cfg["log"])) < at and first.poll() is None:
            time.sleep(0.01)
        old = read_log(cfg["log"])[-1][3]
        killed = kill_marked(marker)
        killed_at = time.time()
        first.wait()
        second = subprocess.run(cmd, env=env, capture_output=True, text=True)
        end = time.time()
        got = json.loads([l for l in second.stdout.splitlines() if l.startswith("{")][-1]) if second.returncode == 0 else {"state": "driver failed"}
        rows = read_log(cfg["log"])
        fresh = [r for r in rows if r[0] > killed_at and r[3] != old]
        seen = {}
        for r in rows:
            seen[(r[1], r[2])] = seen.get((r[1], r[2]), 0) + 1
        want = 469 * cfg["epochs"]
        done = len(seen) == want
        return {"wall": end - start, "state": got["state"] + ("" if done else " (%d of %d steps trained)" % (len(seen), want)),
                "again": fresh[0][0] - killed_at if fresh else None, "lost": sum(n - 1 for n in seen.values()), "killed": killed, "steps": len(rows)}
    finally:
        kill_marked(marker)
        shutil.rmtree(out, ignore_errors=True)


def kill_marked(marker):
    """SIGKILLs every process whose environment holds marker, twice a second
    apart (a daemon may start another as it goes); returns how many."""
    n = _kill_marked(marker)
    time.sleep(1)
    return n + _kill_marked(marker)


def _kill_marked(marker):
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if marker.encode() not in f.read().split(b"\0"):
                    continue
            os.kill(int(pid), signal.SIGKILL)
            n += 1
        except OSError:
            pass
    return n


def make_trainable(tune):
    """The reference 001's Trainable (examples/ray_to_durabletrain/ray_tune_mnist.py), over tune's Trainable."""
    import torch
    import torch.optim as optim
    from mnist_helpers import ConvNet, get_data_loaders, test, train

    class MNISTTrainable(tune.Trainable):
        def setup(self, config):
            torch.set_num_threads(1)
            self.train_loader, self.test_loader = get_data_loaders()
            self.model = ConvNet()
            self.optimizer = optim.SGD(self.model.parameters(), lr=config.get("lr", 0.01), momentum=config.get("momentum", 0.9))

        def step(self):
            train(self.model, self.optimizer, self.train_loader)
            return {"mean_accuracy": test(self.model, self.test_loader)}

        def save_checkpoint(self, checkpoint_dir):
            path = os.path.join(checkpoint_dir, "checkpoint.bin")
            torch.save((self.model.state_dict(), self.optimizer.state_dict()), path)
            return path

        def load_checkpoint(self, checkpoint_path):
            model, optimizer = torch.load(checkpoint_path)
            self.model.load_state_dict(model)
            self.optimizer.load_state_dict(optimizer)
    return MNISTTrainable


def asha_sample(side, out, iterations):
    """The reference 001 search on side: 16 trials, ASHA, one CPU each."""
    if side == "ray":
        import ray
        from ray import tune
        from ray.tune.schedulers import ASHAScheduler
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        import durabletrain as ray  # noqa: F811
        from durabletrain import tune
        from durabletrain.tune import ASHAScheduler
        ray.init(num_cpus=2, storage=os.path.join(out, "storage"))
    start = time.time()
    analysis = tune.run(make_trainable(tune), scheduler=ASHAScheduler(metric="mean_accuracy", mode="max"),
                        stop={"mean_accuracy": 0.99, "training_iteration": iterations}, resources_per_trial={"cpu": 1, "gpu": 0},
                        num_samples=16, config={"lr": tune.uniform(0.001, 1.0), "momentum": tune.uniform(0.1, 0.9)},
                        storage_path=os.path.join(out, "storage"), verbose=0)
    wall = time.time() - start
    best = analysis.get_best_config(metric="mean_accuracy", mode="max")
    df = analysis.results_df
    col = "mean_accuracy" if "mean_accuracy" in df else [c for c in df.columns if c.endswith("mean_accuracy")][0]
    iters = [c for c in df.columns if c.endswith("training_iteration")]
    return {"wall": wall, "best": float(df[col].max()), "trials": int(len(df)), "iterations": int(df[iters[0]].sum()) if iters else None,
            "state": "completed", "best_config": best}


TPE_SPACE = {"lr": ("loguniform", 1e-5, 1.0), "weight_decay": ("loguniform", 1e-6, 0.1),
             "hidden": ("choice", [32, 128, 512]), "batch": ("choice", [32, 64, 128, 256]), "optimizer": ("choice", ["adam", "sgd"])}


def tpe_objective(config):
    """One epoch of the MLP on 6,000 images, scored on 2,000 others: every
    config scores the same on both sides (one weight seed, one order)."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = fashion_mnist(config["data"], 8000, False)
    x, y = data.tensors
    g = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:6000], y[:6000]), batch_size=int(config["batch"]), shuffle=True, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(784, int(config["hidden"])), torch.nn.ReLU(), torch.nn.Linear(int(config["hidden"]), 10))
    opt_cls = torch.optim.Adam if config["optimizer"] == "adam" else torch.optim.SGD
    opt = opt_cls(model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"])
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    with torch.no_grad():
        acc = float((model(x[6000:]).argmax(1) == y[6000:]).float().mean())
    if config["api"] == "ray":
        from ray import tune
    else:
        from durabletrain import tune
    tune.report({"accuracy": acc})


def tpe_sample(side, out, seed, trials):
    """One TPE search of trials on side, seeded; its best accuracy and wall time."""
    if side == "ray":
        import ray
        from ray import tune
        from ray.tune.search.optuna import OptunaSearch
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        trainable = tune.with_resources(tpe_objective, {"cpu": 1})
        run_config = tune.RunConfig(name="tpe-%d" % seed, storage_path=os.path.join(out, "storage"), verbose=0)
    else:
        import durabletrain as ray  # noqa: F811
        from durabletrain import tune
        from durabletrain.train import RunConfig
        from durabletrain.tune.search.optuna import OptunaSearch
        ray.init(num_cpus=2, storage=os.path.join(out, "storage"))
        trainable = tpe_objective
        run_config = RunConfig(name="tpe-%d-%d" % (seed, os.getpid()), verbose=0)
    space = {"data": DATA, "api": side}
    for k, (kind, *args) in TPE_SPACE.items():
        space[k] = tune.loguniform(*args) if kind == "loguniform" else tune.choice(args[0])
    start = time.time()
    grid = tune.Tuner(trainable, param_space=space, run_config=run_config,
                      tune_config=tune.TuneConfig(metric="accuracy", mode="max", num_samples=trials, max_concurrent_trials=2,
                                                  search_alg=OptunaSearch(seed=seed))).fit()
    wall = time.time() - start
    df = grid.get_dataframe()
    accs = [float(a) for a in df["accuracy"] if a == a]
    return {"wall": wall, "best": max(accs) if accs else None, "trials": len(accs),
            "best_half": max(accs[:trials // 2]) if len(accs) >= trials // 2 else None, "state": "completed", "seed": seed}


PBT_MUTATIONS = {"lr": ("loguniform", 1e-4, 0.5), "momentum": ("choice", [0.0, 0.5, 0.9])}


def iterative_objective(config):
    """The PBT and search-driver jobs' trial: the MLP (784-128-10), one
    iteration = 1,000 training images (a tenth of 10,000, in turn), scored
    on 2,000 others; a checkpoint (model, optimizer, iteration) every
    iteration, from which a trial resumes, cloned or restored, at the
    config's lr and momentum (as PBT's explore changes them). With
    config["log"], every iteration trained is logged (time, trial, iteration)."""
    import tempfile as _tempfile
    import torch
    torch.set_num_threads(1)
    if config["api"] == "ray":
        from ray import tune
        from ray.tune import Checkpoint
    else:
        from durabletrain import tune
        from durabletrain.train import Checkpoint
    x, y = fashion_mnist(config["data"], 12000, False).tensors
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    start = 0
    ck = tune.get_checkpoint()
    if ck:
        with ck.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["iteration"]
    for g in opt.param_groups:  # the trial's values, also after a clone
        g["lr"], g["momentum"] = config["lr"], config["momentum"]
    for it in range(start, config["iterations"]):
        part = (it % 10) * 1000
        g = torch.Generator().manual_seed(it)
        order = torch.randperm(1000, generator=g) + part
        for b in range(0, 1000, 64):
            idx = order[b:b + 64]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            acc = float((model(x[10000:]).argmax(1) == y[10000:]).float().mean())
        if config.get("log"):  # a trial of the grid is its lr
            with open(config["log"], "a") as f:
                f.write("%.6f %g %d\n" % (time.time(), config["lr"], it))
        if config.get("sleep"):
            time.sleep(config["sleep"])
        with _tempfile.TemporaryDirectory() as d:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "iteration": it + 1}, os.path.join(d, "state.pt"))
            tune.report({"mean_accuracy": acc}, checkpoint=Checkpoint.from_directory(d))


def _tune_side(side, out):
    """side's tune module, its RunConfig, its trainable for iterative_objective."""
    if side == "ray":
        import ray
        from ray import tune
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        return tune, tune.RunConfig, tune.with_resources(iterative_objective, {"cpu": 1})
    import durabletrain as ray  # noqa: F811
    from durabletrain import tune
    from durabletrain.train import RunConfig
    ray.init(num_cpus=2, storage=os.path.join(out, "storage"))
    return tune, RunConfig, iterative_objective


def pbt_sample(side, out, population, iterations, interval):
    """One PBT search of population trials on side: Ray's scheduler, or
    ours, with the same space, mutations, interval and budget."""
    tune, RunConfig, trainable = _tune_side(side, out)
    space = {"data": DATA, "api": side, "iterations": iterations,
             "lr": tune.loguniform(1e-4, 0.5), "momentum": tune.choice([0.0, 0.5, 0.9])}
    mutations = {k: tune.loguniform(*a) if kind == "loguniform" else list(a[0]) for k, (kind, *a) in PBT_MUTATIONS.items()}
    if side == "ray":
        from ray.tune.schedulers import PopulationBasedTraining
    else:
        from durabletrain.tune import PopulationBasedTraining
    # Ray's PBT example's arguments, on both sides.
    pbt = PopulationBasedTraining(time_attr="training_iteration", metric="mean_accuracy", mode="max",
                                  perturbation_interval=interval, hyperparam_mutations=mutations)
    name = "pbt-%d" % os.getpid()
    start = time.time()
    grid = tune.Tuner(trainable, param_space=space,
                      tune_config=tune.TuneConfig(num_samples=population, scheduler=pbt, **({} if side == "ray" else {"max_concurrent_trials": 2})),
                      run_config=RunConfig(name=name, storage_path=os.path.join(out, "storage"), stop={"training_iteration": iterations},
                                           verbose=0)).fit()
    wall = time.time() - start
    df = grid.get_dataframe()
    accs = [float(a) for a in df["mean_accuracy"] if a == a]
    iters = [c for c in df.columns if c.endswith("training_iteration")]
    return {"wall": wall, "best": max(accs) if accs else None, "mean": statistics.mean(accs) if accs else None,
            "trials": len(accs), "state": "completed"}


def tunedriver_script_sample(side, out, name, trials, iterations):
    """The search-driver job's script, as each side's documentation writes
    it: restore the search if it exists (Tuner.can_restore / restore), else
    start it; the trials are a grid over lr, one CPU each, 2 at a time."""
    tune, RunConfig, trainable = _tune_side(side, out)
    path = os.path.join(out, "storage", name)
    lrs = [round(0.01 * (i + 1), 3) for i in range(trials)]
    if tune.Tuner.can_restore(path):
        tuner = tune.Tuner.restore(path, trainable=trainable)  # Ray: resume_unfinished=True by default
    else:
        space = {"data": DATA, "api": side, "iterations": iterations, "log": os.path.join(out, "iterations.log"),
                 "sleep": 0.5, "lr": tune.grid_search(lrs), "momentum": 0.9}
        tuner = tune.Tuner(trainable, param_space=space,
                           tune_config=tune.TuneConfig(metric="mean_accuracy", mode="max", **({} if side == "ray" else {"max_concurrent_trials": 2})),
                           run_config=RunConfig(name=name, storage_path=os.path.join(out, "storage"), verbose=0))
    grid = tuner.fit()
    df = grid.get_dataframe()
    return {"state": "completed", "trials": int(len(df)), "done": int(sum(1 for a in df["mean_accuracy"] if a == a))}


def tunedriver_sample(side, trials, iterations, after):
    """The search-driver job: the script's driver SIGKILLed with every
    process of its cluster once `after` trials have finished, then the
    script run again at once; whether the search completes, the
    iterations trained twice, and the wall time from the start."""
    out = tempfile.mkdtemp(prefix="raybench-")
    name = "bench-search-%d" % os.getpid()
    marker = "RAYBENCH_SAMPLE=" + os.path.basename(out)
    env = dict(os.environ, OMP_NUM_THREADS="1", RAYBENCH_SAMPLE=os.path.basename(out), DURABLETRAIN_HOME=os.path.join(out, "home"))
    log = os.path.join(out, "iterations.log")
    cmd = [sys.executable, HERE, "--search-driver", side, out, name, str(trials), str(iterations)]

    def logged():
        try:
            with open(log) as f:
                return [ln.split() for ln in f if ln.strip()]
        except OSError:
            return []

    def finished():
        by = {}
        for _, trial, it in logged():
            by.setdefault(trial, set()).add(int(it))
        return sum(1 for its in by.values() if len(its) >= iterations)
    try:
        start = time.time()
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while finished() < after and first.poll() is None:
            time.sleep(0.05)
        if first.poll() is not None:
            return {"state": "the first driver ended before the kill (rc %s)" % first.returncode}
        killed = kill_marked(marker)
        killed_at = time.time()
        first.wait()
        second = subprocess.run(cmd, env=env, capture_output=True, text=True)
        end = time.time()
        got = {"state": "driver failed (rc %d): %s" % (second.returncode, (second.stderr.strip().splitlines() or [""])[-1][:200])}
        if second.returncode == 0:
            got = json.loads([l for l in second.stdout.splitlines() if l.startswith("{")][-1])
        rows = logged()
        seen = {}
        for _, trial, it in rows:
            seen[(trial, it)] = seen.get((trial, it), 0) + 1
        fresh = [float(r[0]) for r in rows if float(r[0]) > killed_at]
        done = len(seen) == trials * iterations
        return {"wall": end - start, "again": (fresh[0] - killed_at) if fresh else None,
                "lost": sum(n - 1 for n in seen.values()), "killed": killed,
                "state": got["state"] + ("" if done else " (%d of %d iterations trained)" % (len(seen), trials * iterations))}
    finally:
        kill_marked(marker)
        shutil.rmtree(out, ignore_errors=True)


def _fit(trainer):
    try:
        trainer.fit()
        return "completed"
    except Exception as e:  # the run's own failure is a figure, not the bench's
        return "failed: %s" % str(e).splitlines()[0][:120]


def figures(cfg, start, end, fault, state):
    rows = read_log(cfg["log"])
    per_epoch = None
    out = {"wall": end - start, "state": state, "steps": len(rows)}
    if rows:
        out["first_step"] = rows[0][0] - start
    if fault is not None and fault.killed_at:
        out["again"] = (fault.again_at - fault.killed_at) if fault.again_at else None
        # Steps trained twice: every (epoch, step) logged more than once.
        seen = {}
        for r in rows:
            seen[(r[1], r[2])] = seen.get((r[1], r[2]), 0) + 1
        out["lost"] = sum(n - 1 for n in seen.values())
        # Where "again" goes: the kill to the new gang's functions entered
        # (the last rank's: a gang trains once every rank has), then to every
        # rank ready (its data, model, process group and checkpoint loaded).
        marks = read_phases(cfg["pids"], fault.killed_at)
        if fault.again_at and len(marks.get("entry", {})) >= 2 and len(marks.get("ready", {})) >= 2:
            out["to_entry"] = max(marks["entry"].values()) - fault.killed_at
            out["to_ready"] = max(marks["ready"].values()) - fault.killed_at
    return out


# ---- the sitting -------------------------------------------------------------------------

def run_sample(side, job, fault, repeats_cap):
    """A sample in a fresh driver process: returns its figures."""
    cmd = [sys.executable, HERE, "--sample", side, job, fault or "-", str(repeats_cap)]
    helpers = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "examples", "ray_to_durabletrain")
    home = tempfile.mkdtemp(prefix="raybench-home-")
    # A cluster of its own (DURABLETRAIN_HOME), as each Ray sample's ray.init()
    # starts one; every process the sample leaves (marked) is killed after it.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in (helpers, os.environ.get("PYTHONPATH")) if p),
               DURABLETRAIN_HOME=home, RAYBENCH_SAMPLE=os.path.basename(home))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    finally:
        kill_marked("RAYBENCH_SAMPLE=" + os.path.basename(home))
        shutil.rmtree(home, ignore_errors=True)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"state": "driver failed (rc %d): %s" % (p.returncode, (p.stderr.strip().splitlines() or [""])[-1][:200])}


def spread(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    m = statistics.median(xs)
    return "%.2f (%.2f-%.2f)" % (m, min(xs), max(xs))


def ratio(ours, peer):
    a = [x for x in ours if x is not None]
    b = [x for x in peer if x is not None]
    if not a or not b:
        return "-"
    return "%.3f" % (statistics.median(a) / statistics.median(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", default="overhead,killed,hung")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hung-cap", type=int, default=120, help="seconds a hung rank may go unnoticed before the sample stops it")
    ap.add_argument("--asha-iterations", type=int, default=10, help="the ASHA search's training_iteration stop")
    ap.add_argument("--tpe-trials", type=int, default=24, help="trials per TPE search")
    ap.add_argument("--tpe-seeds", default="1,2,3", help="the TPE searches' seeds")
    ap.add_argument("--pbt-population", type=int, default=8, help="trials in the PBT population")
    ap.add_argument("--pbt-iterations", type=int, default=12, help="iterations per PBT trial")
    ap.add_argument("--pbt-interval", type=int, default=3, help="PBT's perturbation_interval")
    ap.add_argument("--data", default=DATA)
    a = ap.parse_args()
    print("# durabletrain against Ray Train: %s, %d repeats, %s" % (a.jobs, a.repeats, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())), flush=True)
    for job in a.jobs.split(","):
        if job == "overhead":
            for model in ("mlp", "mlp50", "resnet18"):
                got = {s: [] for s in ("direct", "ray", "durabletrain")}
                for i in range(a.repeats):
                    for side in (("direct", "ray", "durabletrain") if i % 2 == 0 else ("durabletrain", "ray", "direct")):
                        r = run_sample(side, model, None, a.hung_cap)
                        got[side].append(r)
                        print("overhead %s repeat %d %s: %s" % (model, i + 1, side, json.dumps(r)), flush=True)
                table("overhead, " + model, got, ("wall", "first_step"))
        elif job in ("killed", "hung"):
            sides = ("ray", "durabletrain", "durabletrain+spares")
            got = {s: [] for s in sides}
            for i in range(a.repeats):
                for side in (sides if i % 2 == 0 else sides[::-1]):
                    r = run_sample(side, "mlp50", job, a.hung_cap)
                    got[side].append(r)
                    print("%s repeat %d %s: %s" % (job, i + 1, side, json.dumps(r)), flush=True)
            table("rank 1 %s mid-epoch, the MLP" % ("SIGKILLed" if job == "killed" else "SIGSTOPped"), got, ("again", "to_entry", "to_ready", "lost", "wall"))
        elif job == "coordinator":
            got = {s: [] for s in ("ray", "durabletrain")}
            for i in range(a.repeats):
                for side in (("ray", "durabletrain") if i % 2 == 0 else ("durabletrain", "ray")):
                    r = coordinator_sample(side, a.data, 469 + 75)
                    got[side].append(r)
                    print("coordinator repeat %d %s: %s" % (i + 1, side, json.dumps(r)), flush=True)
            table("the driver and its whole cluster SIGKILLed mid-epoch, the script run again, the MLP", got, ("again", "lost", "wall"))
        elif job == "asha":
            got = {s: [] for s in ("ray", "durabletrain")}
            for i in range(a.repeats):
                for side in (("ray", "durabletrain") if i % 2 == 0 else ("durabletrain", "ray")):
                    r = run_sample(side, "asha", None, a.asha_iterations)
                    got[side].append(r)
                    print("asha repeat %d %s: %s" % (i + 1, side, json.dumps(r)), flush=True)
            table("ASHA, the reference 001 search, 16 trials of %d iterations" % a.asha_iterations, got, ("wall", "best", "iterations"))
        elif job == "tpe":
            got = {s: [] for s in ("ray", "durabletrain")}
            for i, seed in enumerate(int(x) for x in a.tpe_seeds.split(",")):
                for side in (("ray", "durabletrain") if i % 2 == 0 else ("durabletrain", "ray")):
                    r = run_sample(side, "tpe:%d:%d" % (seed, a.tpe_trials), None, 0)
                    got[side].append(r)
                    print("tpe seed %d %s: %s" % (seed, side, json.dumps(r)), flush=True)
            table("TPE (Ray: OptunaSearch), %d trials, 2 at a time, seeds %s" % (a.tpe_trials, a.tpe_seeds), got, ("wall", "best", "best_half"))
        elif job == "pbt":
            got = {s: [] for s in ("ray", "durabletrain")}
            for i in range(a.repeats):
                for side in (("ray", "durabletrain") if i % 2 == 0 else ("durabletrain", "ray")):
                    r = run_sample(side, "pbt:%d:%d:%d" % (a.pbt_population, a.pbt_iterations, a.pbt_interval), None, 0)
                    got[side].append(r)
                    print("pbt repeat %d %s: %s" % (i + 1, side, json.dumps(r)), flush=True)
            table("PBT, a population of %d, %d iterations, perturbed every %d" % (a.pbt_population, a.pbt_iterations, a.pbt_interval),
                  got, ("wall", "best", "mean"))
        elif job == "tunedriver":
            got = {s: [] for s in ("ray", "durabletrain")}
            for i in range(a.repeats):
                for side in (("ray", "durabletrain") if i % 2 == 0 else ("durabletrain", "ray")):
                    r = tunedriver_sample(side, 8, 6, 3)
                    got[side].append(r)
                    print("tunedriver repeat %d %s: %s" % (i + 1, side, json.dumps(r)), flush=True)
            table("a search's driver and its whole cluster SIGKILLed after 3 of 8 trials, the script run again (Tuner.restore)",
                  got, ("again", "lost", "wall"))
        else:
            sys.exit("bench ray: unknown job %r; want overhead, killed, hung, coordinator, asha, tpe, pbt or tunedriver" % job)


def table(title, got, keys):
    print("\n## %s: median (min-max) over the repeats; ratio = durabletrain / peer, of the medians" % title)
    sides = list(got)
    print("| | " + " | ".join(sides) + " | durabletrain/ray |" + (" durabletrain/direct |" if "direct" in got else ""))
    print("|---|" + "---:|" * (len(sides) + 1 + ("direct" in got)))
    for k in keys:
        cols = [spread([r.get(k) for r in got[s]]) for s in sides]
        row = {"lost": "| steps lost | ", "best": "| best mean_accuracy | ", "iterations": "| iterations trained | ",
               "best_half": "| best in the first half of the trials | ", "mean": "| mean final accuracy of the population | "}.get(k, "| %s s | " % k)
        row += " | ".join(cols) + " | " + ratio([r.get(k) for r in got["durabletrain"]], [r.get(k) for r in got["ray"]])
        if "durabletrain+spares" in got:
            row += " (with spares: " + ratio([r.get(k) for r in got["durabletrain+spares"]], [r.get(k) for r in got["ray"]]) + ")"
        row += " |"
        if "direct" in got:
            row += " " + ratio([r.get(k) for r in got["durabletrain"]], [r.get(k) for r in got["direct"]]) + " |"
        print(row)
    states = {s: sorted(set(r.get("state", "?") for r in got[s])) for s in sides}
    print("| outcome | " + " | ".join("; ".join(states[s]) for s in sides) + " | |" + (" |" if "direct" in got else ""))
    print(flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-direct":
        train_loop(json.loads(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--sample":
        side, job, fault, cap = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
        out, name = (sys.argv[6], sys.argv[7]) if len(sys.argv) > 7 else (None, None)
        r = sample(side, job, None if fault == "-" else fault, DATA, cap, out, name)
        print(json.dumps(r), flush=True)
        if fault != "coordinator":  # the coordinator job's first driver is killed; its second leaves the cluster to the bench

            def stop():
                mod = sys.modules.get("ray") if side == "ray" else sys.modules.get("durabletrain")
                if mod is not None:
                    mod.shutdown()
            t = threading.Thread(target=stop, daemon=True)
            t.start()
            t.join(30)
        os._exit(0)  # past a hung run's threads, and each side's shutdown at exit is its own
    elif len(sys.argv) > 1 and sys.argv[1] == "--search-driver":
        side, out, name, trials, iterations = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
        print(json.dumps(tunedriver_script_sample(side, out, name, trials, iterations)), flush=True)
        os._exit(0)  # the cluster is the bench's to kill
    else:
        main()
