"""The rank side of a Ray-style training function on durabletrain.

``python -m durabletrain._rank`` (the command a TorchTrainer's ranks run)
loads the function, begins the run's first epoch and calls it; each
``durabletrain.train.report()`` outside a prepared data loader's loop ends
one epoch (Ray's ``training_iteration``) and begins the next, and the
function returning ends the run's training. Standard library only.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional

import durabletrain as _dt

#: Whether this process runs a function under durabletrain._rank.
active = False
#: The epoch begun and not yet reported, if any.
_open_epoch: Optional[int] = None
#: The model prepare_model() wrapped, whose training mode tells a training
#: loader's loop from an evaluation one.
model: Any = None
_warned: set = set()


def begin_first() -> bool:
    """Begins the run's first epoch for this process; False when there is none to train."""
    global _open_epoch
    if _dt._channel() is None:
        first = _dt._env_int("DURABLETRAIN_START_EPOCH", 0)
        _dt._begin(first, _dt._env_int("DURABLETRAIN_START_STEP", 0), 0)
        _open_epoch = first
        return True
    return _next()


def _next() -> bool:
    global _open_epoch
    _open_epoch = None
    if _dt._channel() is None:
        e = (_dt._epoch or 0) + 1
        _dt._begin(e, 0, 0)
        _open_epoch = e
        return True
    _dt._send({"op": "ready"})
    msg = _dt._receive()
    if msg.get("op") != "epoch":
        return False
    _dt._begin(int(msg.get("epoch", 0)), int(msg.get("start_step", 0)), int(msg.get("sync", 0)))
    _open_epoch = _dt._epoch
    return True


def numeric_metrics(metrics: Dict[str, Any]) -> Dict[str, float]:
    """The metrics durabletrain records: those with a number for a value
    (Python's, NumPy's or a one-element tensor's); others are left out, once
    said so on stderr."""
    if not isinstance(metrics, dict):
        raise TypeError("durabletrain.train.report: metrics is %r; want a dict of metric names to numbers" % (metrics,))
    out = {}
    for k, v in metrics.items():
        if not isinstance(k, str):
            raise TypeError("durabletrain.train.report: metric name %r; want a string" % (k,))
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            if k not in _warned:
                _warned.add(k)
                print("durabletrain: metric %r is %r, not a number: not recorded" % (k, type(v).__name__), file=sys.stderr)
    return out


def report(metrics: Dict[str, Any], checkpoint_dir: Optional[str]) -> None:
    """A report at a step (inside a prepared loader's loop) or the end of
    an epoch (anywhere else), as durabletrain.report() takes them; at the
    end of an epoch it begins the next one, or ends the program when the
    run has its epochs."""
    values = numeric_metrics(metrics)
    if not active:
        _dt.report(values, checkpoint_dir=checkpoint_dir)
        return
    if _dt._in_steps:
        _dt.report(values, checkpoint_dir=checkpoint_dir)
        return
    _dt.report(values, checkpoint_dir=checkpoint_dir, checkpoint_optional=True)
    if not _next():
        raise SystemExit(0)


def finish() -> None:
    """The function returned: an epoch begun and not trained ends the run's training."""
    if _dt._channel() is None or _open_epoch is None:
        return
    _dt._send({"op": "finished", "epoch": _open_epoch})
    msg = _dt._receive()
    if msg.get("op") != "exit":
        raise SystemExit("durabletrain: unexpected answer to finished: %r" % (msg,))

