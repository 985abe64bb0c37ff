"""durabletrain's side of a rank process (standard library only).

The worker starts your script once per rank of a gang, with torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, MASTER_ADDR, MASTER_PORT) and CUDA_VISIBLE_DEVICES
set to the rank's own GPU, so torch.distributed.init_process_group works
unchanged, and drives it over a local control socket, step by step:

    import durabletrain as dt

    lr = dt.config().get("lr", 1e-3)     # the run's config (a trial's hyperparameters)
    ckpt = dt.get_checkpoint()          # a directory restored for you, or None;
    if ckpt:                            # ckpt.epoch and ckpt.step say where it stands
        load(ckpt)
    sampler = dt.ShardSampler(len(data), batch_size=64, seed=0)

    def save():                         # the worker asks for a checkpoint mid-epoch
        write_state_to(out_dir)         # (checkpoint.every_steps, preemption)
        return out_dir

    for epoch in dt.epochs():           # the epochs the run asks for, in order
        sampler.set_epoch(epoch)        # this rank's samples, less those already trained
        for step, batch in dt.steps(batches(sampler), save=save):
            loss = train_step(batch)
            if step % 50 == 0:
                dt.report({"train_loss": loss})   # metrics at any step
        dt.report({"train_loss": ..., "test_loss": ..., "test_accuracy": ...},
                  checkpoint_dir=save())          # the epoch's report; rank 0's is uploaded

A report with a checkpoint_dir inside the steps loop is a checkpoint at that
step, as in Ray Train; every rank must then report at the same steps, as
every rank must break out of the loop together. The gang stops only between
steps, at a step every rank agrees on: when a worker is told to shut down,
every rank of its gang saves at the same step (save=) and leaves; the run
resumes there, exactly (ShardSampler skips the samples already trained).

Run without a worker (DURABLETRAIN_CONTROL unset), epochs() yields
range(DURABLETRAIN_START_EPOCH or 0, DURABLETRAIN_EPOCHS or 1), steps() every
step from DURABLETRAIN_START_STEP, and report() prints, so the same script
runs by hand with plain environment variables.
"""

import json
import os
import random
import socket
import sys
import threading

__all__ = ["config", "epochs", "steps", "report", "get_checkpoint", "start_step", "position", "scratch_dir", "backend", "device", "Checkpoint", "ShardSampler",
           "world_rank", "world_size"]

_sock = None
_reader = None
_send_lock = threading.Lock()  # the keepalive thread and the program's own messages share the socket
_epoch = None       # the epoch being trained
_start = 0          # the step the current epoch began at (above 0 when it resumed mid-way)
_step = 0           # steps of the current epoch done
_sync = 0           # the next step the gang synchronises at; 0: none this epoch
_in_steps = False   # inside a steps() loop that has not ended
_steps_total = 0    # the epoch's steps, when steps() knows them


def _channel():
    global _sock, _reader
    if _sock is None:
        path = os.environ.get("DURABLETRAIN_CONTROL")
        if not path:
            return None
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _sock.connect(path)
        _reader = _sock.makefile("r", encoding="utf-8")
        _start_keepalive()
    return _sock


def _send(msg):
    line = (json.dumps(msg) + "\n").encode("utf-8")
    with _send_lock:
        _sock.sendall(line)


_KEEPALIVE = b'{"op": "alive"}\n'


def _start_keepalive():
    """Every DURABLETRAIN_KEEPALIVE seconds (the worker sets it: a fifth of
    failure.stall_timeout), a daemon thread tells the worker that this
    process still runs. A process that stops (SIGSTOP, a hang in the
    kernel) stops them, and the worker kills it and re-forms the gang
    within the stall timeout; a rank merely blocked in a collective, or
    computing, keeps sending them (PyTorch's collectives and kernels
    release the GIL)."""
    raw = os.environ.get("DURABLETRAIN_KEEPALIVE", "")
    try:
        every = float(raw) if raw else 0.0
    except ValueError:
        raise SystemExit("durabletrain: DURABLETRAIN_KEEPALIVE is %r; want seconds, such as 0.4" % (raw,))
    if not every > 0:
        return
    sock = _sock

    def beat():
        import time
        while True:
            try:
                with _send_lock:
                    sock.sendall(_KEEPALIVE)
            except OSError:
                return  # the worker closed the channel: the program is ending
            time.sleep(every)

    threading.Thread(target=beat, name="durabletrain-keepalive", daemon=True).start()


def _receive():
    line = _reader.readline()
    if not line:
        raise SystemExit("durabletrain: the worker closed the control channel")
    return json.loads(line)


def _env_int(name, default):
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit("durabletrain: %s is %r; want a whole number" % (name, raw))


def config():
    """The run's config: its hyperparameters by name, as Ray Tune passes a
    trainable its config (a search's param_space sets them as
    "config.<key>"; a run sets them in its spec's "config"). Values are
    JSON's: numbers, strings, lists, objects. Run by hand, the JSON object in
    DURABLETRAIN_CONFIG, or {}."""
    raw = os.environ.get("DURABLETRAIN_CONFIG", "")
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise SystemExit("durabletrain: DURABLETRAIN_CONFIG is not JSON: %s" % e)
    if not isinstance(value, dict):
        raise SystemExit("durabletrain: DURABLETRAIN_CONFIG is %r; want a JSON object" % (value,))
    return value


def _cuda():
    """Whether this rank has a GPU: its slot set CUDA_VISIBLE_DEVICES, and torch sees it."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "") in ("", "-1"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def backend():
    """The torch.distributed backend for this rank: "nccl" on a GPU slot,
    "gloo" on a CPU one. dist.init_process_group(dt.backend())."""
    return "nccl" if _cuda() else "gloo"


def device():
    """This rank's torch device: its own GPU (cuda:0, the one
    CUDA_VISIBLE_DEVICES names) on a GPU slot, else the CPU."""
    import torch
    return torch.device("cuda", 0) if _cuda() else torch.device("cpu")


def world_rank():
    return int(os.environ.get("RANK", "0"))


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


class Checkpoint(str):
    """The directory of a restored checkpoint (a str: open files under it),
    with where training stood when it was saved: .epoch and .step (steps of
    that epoch already done; 0 at an epoch's start)."""

    def __new__(cls, path, epoch, step):
        c = str.__new__(cls, path)
        c.epoch, c.step = epoch, step
        return c

    @property
    def path(self):
        return str(self)


def get_checkpoint():
    """The checkpoint this rank resumes from (a Checkpoint: the directory,
    with .epoch and .step), or None for a fresh start."""
    d = os.environ.get("DURABLETRAIN_CHECKPOINT_DIR")
    if not d or not os.path.isdir(d):
        return None
    return Checkpoint(d, _env_int("DURABLETRAIN_START_EPOCH", 0), _env_int("DURABLETRAIN_START_STEP", 0))


def scratch_dir():
    """A directory of this rank's own (DURABLETRAIN_SCRATCH_DIR): write its
    checkpoints and other files there, not to a path relative to the
    working directory, which ``exec.dir`` shares with every rank and trial
    that runs there. Outside durabletrain: the working directory.

    >>> import durabletrain as dt, os
    >>> os.path.isdir(dt.scratch_dir())
    True
    """
    return os.environ.get("DURABLETRAIN_SCRATCH_DIR") or os.getcwd()


def position():
    """(epoch, steps of it done): where this rank's training stands, within
    epochs(). In a save() callback, the step the state is saved at."""
    return _epoch, _step


def start_step():
    """The step the current epoch starts at: the steps already trained when
    the run resumed mid-epoch, else 0. Within epochs()."""
    return _start


def _begin(epoch, start, sync):
    global _epoch, _start, _step, _sync, _in_steps, _steps_total
    _epoch, _start, _step, _sync, _in_steps, _steps_total = epoch, start, start, sync, False, 0


def epochs():
    """Yields each epoch the run asks this rank to train, until it is done."""
    if _channel() is None:
        first = _env_int("DURABLETRAIN_START_EPOCH", 0)
        for e in range(first, _env_int("DURABLETRAIN_EPOCHS", 1)):
            _begin(e, _env_int("DURABLETRAIN_START_STEP", 0) if e == first else 0, 0)
            yield e
        return
    while True:
        _send({"op": "ready"})
        msg = _receive()
        if msg.get("op") != "epoch":
            return
        _begin(int(msg.get("epoch", 0)), int(msg.get("start_step", 0)), int(msg.get("sync", 0)))
        yield _epoch


def steps(batches, save=None):
    """Yields the steps of the current epoch from start_step(): given a
    number of steps n, each step's index (start_step() .. n-1); given an
    iterable (a DataLoader, a list of batches) of the steps still to train,
    (step, batch) pairs. The worker may stop the loop between two steps, at a
    step every rank agrees on: for a checkpoint (checkpoint.every_steps) or
    because a worker is shutting down. It then calls save(), which must
    write this rank's whole state at that step and return its directory, and
    either goes on or ends the program. Without save=, such a stop fails the
    rank, and the run resumes from its latest checkpoint."""
    global _step, _in_steps, _steps_total
    if _epoch is None:
        raise RuntimeError("durabletrain.steps() is called within an epoch of durabletrain.epochs()")
    if isinstance(batches, int):
        items, _steps_total = None, batches
        indices = range(_start, batches)
    else:
        items = iter(batches)
        try:
            _steps_total = _start + len(batches)
        except TypeError:
            _steps_total = 0
        indices = None
    _in_steps = True
    try:
        step = _start
        while True:
            # The body trains step `step`: from its start, the position is
            # after it (what a report or save in the body is at).
            if indices is not None:
                if step >= _steps_total:
                    return
                _step = step + 1
                yield step
            else:
                try:
                    item = next(items)
                except StopIteration:
                    return
                _step = step + 1
                yield step, item
            step += 1
            if _sync and step >= _sync and _sock is not None:
                _synchronise(save)
    finally:
        _in_steps = False


def _synchronise(save):
    """The gang's vote at an agreed step: go on (and till when), or save here."""
    _send({"op": "sync", "epoch": _epoch, "step": _step, "steps": _steps_total})
    _await_go(save)


def _await_go(save):
    global _sync
    while True:
        msg = _receive()
        op = msg.get("op")
        if op == "go":
            _sync = int(msg.get("sync", 0))
            return
        if op == "save":
            if save is None:
                _send({"op": "saved", "epoch": _epoch, "step": _step, "checkpoint_dir": None})
                continue
            d = save()
            if not d or not os.path.isdir(d):
                raise SystemExit("durabletrain: save() returned %r; want the directory it wrote the checkpoint to" % (d,))
            _send({"op": "saved", "epoch": _epoch, "step": _step, "checkpoint_dir": os.path.abspath(d)})
            continue
        if op == "exit":
            raise SystemExit(0)
        raise SystemExit("durabletrain: unexpected message from the worker: %r" % (msg,))


def report(metrics, checkpoint_dir=None, checkpoint_optional=False):
    """Reports metrics (train_loss, test_loss, test_accuracy, and any others
    by name) and, optionally, a directory holding this rank's checkpoint.

    Inside a steps() loop it reports at the step just done: metrics alone
    are sent without waiting; with a checkpoint_dir the gang checkpoints at
    this step (every rank must report one at the same steps). After the
    loop (or without one) it is the epoch's report; with
    checkpoint_optional=True and no checkpoint_dir it has no checkpoint on
    purpose (Ray's report of metrics alone: the run keeps its latest).
    Returns once the worker has taken the checkpoint: the directory may then
    be reused."""
    metrics = {k: float(v) for k, v in metrics.items()}
    for k, v in metrics.items():
        if v != v or v in (float("inf"), float("-inf")):
            raise SystemExit("durabletrain: metric %s is %s at epoch %s step %s: training diverged (lower the learning rate, "
                             "or check the data)" % (k, v, _epoch, _step))
    if _channel() is None:
        where = "epoch %s" % _epoch if not _in_steps else "epoch %s step %s" % (_epoch, _step)
        print("durabletrain: %s: %s%s" % (where, json.dumps(metrics),
              " (checkpoint %s)" % checkpoint_dir if checkpoint_dir else ""), file=sys.stderr)
        return
    if checkpoint_dir is not None:
        checkpoint_dir = os.path.abspath(checkpoint_dir)
    if _in_steps:
        if checkpoint_dir is None:
            _send({"op": "metrics", "epoch": _epoch, "step": _step, "metrics": metrics})
            return
        _send({"op": "report", "epoch": _epoch, "step": _step, "steps": _steps_total, "metrics": metrics,
               "checkpoint_dir": checkpoint_dir})
        _await_go(None)
        return
    msg = {"op": "report", "epoch": _epoch, "step": _step, "steps": _steps_total, "metrics": metrics,
           "checkpoint_dir": checkpoint_dir, "end": True}
    if checkpoint_optional and checkpoint_dir is None:
        msg["no_checkpoint"] = True
    _send(msg)
    msg = _receive()
    if msg.get("op") != "ack":
        raise SystemExit("durabletrain: unexpected answer to a report: %r" % (msg,))


class ShardSampler:
    """This rank's share of a data set's indices for an epoch, in the order
    torch's DistributedSampler(shuffle, seed, drop_last=True) gives them
    (torch.randperm seeded with seed + epoch; without torch, Python's own
    shuffle, seeded the same), less the samples of the steps the epoch has
    already trained when it resumed mid-way: start_step() × batch_size. So a
    run stopped at any step resumes on exactly the samples it had not seen.

        sampler = dt.ShardSampler(len(train_set), batch_size=64, seed=0)
        loader = DataLoader(train_set, batch_size=64, sampler=sampler)
        for epoch in dt.epochs():
            sampler.set_epoch(epoch)
            for step, (x, y) in dt.steps(loader, save=save): ...
    """

    def __init__(self, size, batch_size, seed=0, shuffle=True, rank=None, world=None):
        if size < 0 or batch_size < 1:
            raise ValueError("ShardSampler: size %r and batch_size %r; want size >= 0 and batch_size >= 1" % (size, batch_size))
        self.size, self.batch_size, self.seed, self.shuffle = size, batch_size, seed, shuffle
        self.rank = world_rank() if rank is None else rank
        self.world = world_size() if world is None else world
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch, start=None):
        """Chooses the epoch's order, and skips the steps already trained
        (start, or start_step() when the epoch is the current one)."""
        self.epoch = epoch
        if start is None:
            start = _start if epoch == _epoch else 0
        self.skip = start * self.batch_size

    def indices(self):
        """This rank's whole shard of the epoch, before skipping."""
        n = self.size // self.world * self.world
        if not self.shuffle:
            order = list(range(self.size))
        else:
            try:
                import torch
                g = torch.Generator()
                g.manual_seed(self.seed + self.epoch)
                order = torch.randperm(self.size, generator=g).tolist()
            except ImportError:
                order = list(range(self.size))
                random.Random(self.seed + self.epoch).shuffle(order)
        return order[:n][self.rank:n:self.world]

    def __iter__(self):
        return iter(self.indices()[self.skip:])

    def __len__(self):
        return max(0, self.size // self.world - self.skip)


__version__ = "0.6.0"


def init(address=None, **kwargs):
    """Starts a local cluster (the embedded Temporal dev server and a worker)
    or connects to one: Ray's ray.init(). See durabletrain._cluster.init."""
    from durabletrain import _cluster
    return _cluster.init(address, **kwargs)


def shutdown():
    """Stops the local cluster init() started."""
    from durabletrain import _cluster
    _cluster.shutdown()


def __getattr__(name):
    """``durabletrain.train`` and ``durabletrain.tune`` import on first use,
    as ``ray.train`` and ``ray.tune`` are reached from ``import ray``: a Ray
    script's ``import ray`` becomes ``import durabletrain as ray``, and a rank
    process that only steps (this module) imports nothing more."""
    if name in ("train", "tune"):
        import importlib
        return importlib.import_module("durabletrain." + name)
    raise AttributeError("module 'durabletrain' has no attribute %r" % (name,))
