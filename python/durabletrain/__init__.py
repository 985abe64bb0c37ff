"""durabletrain's side of a rank process (standard library only).

The worker starts your script once per rank of a gang, with torchrun's
environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, TORCHELASTIC_RUN_ID,
TORCHELASTIC_RESTART_COUNT, MASTER_ADDR, MASTER_PORT) and CUDA_VISIBLE_DEVICES
set to the rank's own GPU, so torch.distributed.init_process_group works
unchanged, and drives it one epoch
at a time over a local control socket:

    import durabletrain as dt

    lr = dt.config().get("lr", 1e-3)      # the run's config (a trial's hyperparameters)
    ckpt = dt.get_checkpoint()           # a directory restored for you, or None
    start = load(ckpt) if ckpt else 0
    for epoch in dt.epochs():            # the epochs the run asks for, in order
        train_one_epoch(epoch)
        dt.report({"train_loss": ..., "test_loss": ..., "test_accuracy": ...},
                  checkpoint_dir=save_to_a_directory())   # rank 0's is uploaded

Run without a worker (DURABLETRAIN_CONTROL unset), epochs() yields
range(DURABLETRAIN_EPOCHS or 1) and report() prints, so the same script runs
by hand with plain environment variables.
"""

import json
import os
import socket
import sys

__all__ = ["config", "epochs", "report", "get_checkpoint", "world_rank", "world_size"]

_sock = None
_reader = None
_current = None


def _channel():
    global _sock, _reader
    if _sock is None:
        path = os.environ.get("DURABLETRAIN_CONTROL")
        if not path:
            return None
        _sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _sock.connect(path)
        _reader = _sock.makefile("r", encoding="utf-8")
    return _sock


def _send(msg):
    _sock.sendall((json.dumps(msg) + "\n").encode("utf-8"))


def _receive():
    line = _reader.readline()
    if not line:
        raise SystemExit("durabletrain: the worker closed the control channel")
    return json.loads(line)


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


def world_rank():
    return int(os.environ.get("RANK", "0"))


def world_size():
    return int(os.environ.get("WORLD_SIZE", "1"))


def get_checkpoint():
    """The directory of the checkpoint this rank resumes from, or None."""
    d = os.environ.get("DURABLETRAIN_CHECKPOINT_DIR")
    return d if d and os.path.isdir(d) else None


def epochs():
    """Yields each epoch the run asks this rank to train, until it is done."""
    global _current
    if _channel() is None:
        first = int(os.environ.get("DURABLETRAIN_START_EPOCH", "0"))
        for e in range(first, int(os.environ.get("DURABLETRAIN_EPOCHS", "1"))):
            _current = e
            yield e
        return
    while True:
        _send({"op": "ready"})
        msg = _receive()
        if msg.get("op") != "epoch":
            return
        _current = int(msg["epoch"])
        yield _current


def report(metrics, checkpoint_dir=None):
    """Reports the epoch's metrics (train_loss, test_loss, test_accuracy, and
    any others) and, optionally, a directory holding this rank's checkpoint.
    Returns once the worker has taken the checkpoint: the directory may then
    be reused."""
    metrics = {k: float(v) for k, v in metrics.items()}
    if _channel() is None:
        print("durabletrain: epoch %s: %s%s" % (_current, json.dumps(metrics),
              " (checkpoint %s)" % checkpoint_dir if checkpoint_dir else ""), file=sys.stderr)
        return
    if checkpoint_dir is not None:
        checkpoint_dir = os.path.abspath(checkpoint_dir)
    _send({"op": "report", "epoch": _current, "metrics": metrics, "checkpoint_dir": checkpoint_dir})
    msg = _receive()
    if msg.get("op") != "ack":
        raise SystemExit("durabletrain: unexpected answer to a report: %r" % (msg,))
