"""Ray Train's Transformers integration over durabletrain
(``ray.train.huggingface.transformers`` → ``durabletrain.train.huggingface.transformers``).

Inside a ``TorchTrainer``'s training function, a ``transformers.Trainer``
runs on the run's ranks as it does under Ray Train::

    trainer = transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=test)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    trainer.train()

and durably by the step:

- Each epoch of the Trainer is one of the run's iterations: at its end the
  Trainer saves a checkpoint (``checkpoint-<global step>``, its own format),
  and the callback reports it with the epoch's logged metrics
  (``log_history``: ``loss``, ``learning_rate``, ``eval_*``, ...). As under
  Ray Train, the reported checkpoint holds the Trainer's in a directory named
  ``checkpoint`` (``RayTrainReportCallback.CHECKPOINT_NAME``).
- Between two optimizer steps the gang may stop at a step every rank agrees
  on (``CheckpointConfig(checkpoint_every_steps=N)``, or a worker told to
  shut down): the Trainer saves there, on every rank, and the run resumes at
  that step. A checkpoint the Trainer saves by itself inside an epoch
  (``save_strategy="steps"``) is one of the run's checkpoints too.
- ``prepare_trainer`` checks that every rank trains its own shard in one
  process group (on CPU, a Trainer whose ranks each train alone on the whole
  data set is the known trap: it is refused, naming what it saw), and makes
  ``trainer.train()`` resume from the run's checkpoint when it is given no
  ``resume_from_checkpoint``; the Trainer then skips the batches the epoch
  had trained and restores its optimizer, scheduler and RNG state.

Example:
    >>> from durabletrain.train.huggingface.transformers import RayTrainReportCallback
    >>> RayTrainReportCallback.CHECKPOINT_NAME
    'checkpoint'
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict, Optional

import transformers

import durabletrain as _dt
from durabletrain import _session

__all__ = ["RayTrainReportCallback", "prepare_trainer"]


def _numbers(logs: Dict[str, Any]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for k, v in (logs or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[k] = float(v)
    return out


class RayTrainReportCallback(transformers.TrainerCallback):
    """Reports each epoch's logged metrics with the Trainer's checkpoint
    (Ray Train's RayTrainReportCallback), and keeps the gang's steps."""

    CHECKPOINT_NAME = "checkpoint"

    def __init__(self) -> None:
        super().__init__()
        self._epoch = 0               # the Trainer's epoch being trained
        self._per_epoch = 0           # its optimizer steps
        self._history = 0             # log_history entries before the epoch began
        self._pending: Optional[str] = None  # "stop": the gang voted to save here; "end": the epoch's own save
        self._checked = False
        self._held: Dict[str, float] = {}  # metrics logged while a save the gang voted for is due

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, **kwargs: Any) -> None:
        if train_dataloader is not None:
            n = len(train_dataloader)
            ga = max(1, int(args.gradient_accumulation_steps))
            self._per_epoch = max(n // ga + int(n % ga > 0), 1)
        if state.global_step > 0:
            _rescale(args.learning_rate, optimizer, lr_scheduler)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not _session.active or _dt._epoch is None:
            return
        per = self._per_epoch or 1
        self._epoch = int(state.global_step // per)
        done = state.global_step - self._epoch * per
        if not self._checked:
            self._checked = True
            if (self._epoch, done) != (_dt._epoch, _dt._start):
                raise SystemExit("durabletrain.train.huggingface.transformers: the Trainer resumed at epoch %d step %d, but the run's "
                                 "checkpoint is at epoch %d step %d: call trainer.train() without resume_from_checkpoint "
                                 "(prepare_trainer resumes from the run's checkpoint)" % (self._epoch, done, _dt._epoch, _dt._start))
        elif self._epoch != _dt._epoch:
            raise SystemExit("durabletrain.train.huggingface.transformers: the Trainer trains epoch %d where the run is at epoch %d: "
                             "is RayTrainReportCallback added to it once?" % (self._epoch, _dt._epoch))
        self._history = len(state.log_history)
        _dt._in_steps = True
        _dt._steps_total = per

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if _session.active and _dt._in_steps and _dt._channel() is not None:
            m = _numbers(logs or {})
            if m and self._pending == "stop":
                self._held.update(m)  # the worker waits for the save first: sent after it
            elif m:
                _dt.report(m)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not _session.active or _dt._epoch is None or not _dt._in_steps:
            return
        _dt._step = state.global_step - self._epoch * (self._per_epoch or 1)
        if not (_dt._sync and _dt._step >= _dt._sync and _dt._sock is not None):
            return
        _dt._send({"op": "sync", "epoch": _dt._epoch, "step": _dt._step, "steps": _dt._steps_total})
        msg = _dt._receive()
        op = msg.get("op")
        if op == "go":
            _dt._sync = int(msg.get("sync", 0))
        elif op == "save":  # the Trainer saves after this hook; on_save says where
            control.should_save = True
            self._pending = "stop"
        elif op == "exit":
            raise SystemExit(0)
        else:
            raise SystemExit("durabletrain: unexpected message from the worker: %r" % (msg,))

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not _session.active or _dt._epoch is None:
            return
        # Every epoch ends with a checkpoint, the iteration's: the Trainer
        # evaluates (when asked to) and then saves, after this hook.
        control.should_save = True
        self._pending = "end"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not _session.active or _dt._epoch is None:
            return
        d = os.path.join(args.output_dir, "%s-%d" % (transformers.trainer_utils.PREFIX_CHECKPOINT_DIR, state.global_step))
        os.makedirs(d, exist_ok=True)  # a rank the Trainer does not write on reports an empty one
        pending, self._pending = self._pending, None
        if pending == "stop":
            wrapped = _as_reported(d)
            _dt._send({"op": "saved", "epoch": _dt._epoch, "step": _dt._step, "checkpoint_dir": wrapped})
            _dt._await_go(None)
            shutil.rmtree(wrapped, ignore_errors=True)
            held, self._held = self._held, {}
            if held:
                _dt.report(held)
            return
        if pending == "end":
            metrics: Dict[str, float] = {}
            for entry in state.log_history[self._history:]:
                metrics.update(_numbers(entry))
            metrics.update(epoch=float(state.epoch or 0), step=float(state.global_step))
            _dt._in_steps = False
            _report(metrics, d)
            return
        # The Trainer's own save inside the epoch (save_strategy="steps"): every rank saves at that step.
        _dt._step = state.global_step - self._epoch * (self._per_epoch or 1)
        last = _numbers(state.log_history[-1]) if state.log_history else {}
        _report(last, d)


def _as_reported(d: str) -> str:
    """The directory a checkpoint is reported as, laid out as Ray Train's
    callback lays it out: the Trainer's ``checkpoint-N`` as ``checkpoint/``
    (``RayTrainReportCallback.CHECKPOINT_NAME``) inside it, so that a Ray
    script's ``os.path.join(checkpoint_dir, CHECKPOINT_NAME)`` finds the
    model. Its files are hard links to the Trainer's (no copy; a copy where
    links cannot be made), and the Trainer may rotate its own away after."""
    out = os.path.join(os.path.dirname(os.path.abspath(d)), "reported-" + os.path.basename(d))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(d, os.path.join(out, RayTrainReportCallback.CHECKPOINT_NAME), copy_function=link)
    return out


def _report(metrics: Dict[str, float], d: str) -> None:
    from durabletrain import train
    wrapped = _as_reported(d)
    try:
        train.report(metrics, checkpoint=train.Checkpoint.from_directory(wrapped))
    finally:
        shutil.rmtree(wrapped, ignore_errors=True)


def _rescale(lr: float, optimizer: Any, scheduler: Any) -> None:
    """A Trainer resumed with another learning rate than its checkpoint's
    (a PBT exploit's perturbation) trains at the new one: its optimizer and
    scheduler came back with the donor's, which would otherwise win. The
    schedule keeps its shape, scaled to the new rate."""
    bases = list(getattr(scheduler, "base_lrs", None) or [])
    if optimizer is None or not bases or all(abs(b - lr) <= 1e-12 * max(abs(lr), 1e-30) for b in bases):
        return
    for i, g in enumerate(optimizer.param_groups):
        base = bases[min(i, len(bases) - 1)]
        g["lr"] = g["lr"] * (lr / base) if base else lr
        g["initial_lr"] = lr
    scheduler.base_lrs = [lr] * len(bases)
    if hasattr(scheduler, "_last_lr"):
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def _world(trainer: Any) -> tuple:
    args = trainer.args
    return int(getattr(args, "world_size", 1)), int(getattr(args, "process_index", 0))


def prepare_trainer(trainer: Any) -> Any:
    """Checks the Trainer and makes it durable (Ray Train's prepare_trainer).

    Every rank must be one process of the Trainer's process group, with its
    own shard: a Trainer whose ``args.world_size`` is not the run's number of
    ranks (each rank training alone, on the whole data set) is refused,
    naming both. A relative ``args.output_dir`` becomes one in the rank's
    own directory (``durabletrain.scratch_dir()``). The report callback is
    added if missing, and
    ``trainer.train()`` without ``resume_from_checkpoint`` resumes from the
    run's checkpoint."""
    world, index = _world(trainer)
    if world != _dt.world_size() or index != _dt.world_rank():
        raise ValueError("prepare_trainer: the Trainer sees %d process(es), this one number %d, where the run has %d ranks and this "
                         "is rank %d: every rank would train alone on the whole data set. Build TrainingArguments inside the "
                         "training function (after the process group is up), and leave its local_rank and ddp_backend unset"
                         % (world, index, _dt.world_size(), _dt.world_rank()))
    # A relative output_dir is the rank's own: the working directory may be
    # shared by every rank and trial on the host (the driver's, on a local
    # cluster), and two Trainers saving checkpoint-N there at once would mix
    # their files.
    out = trainer.args.output_dir or "trainer_output"
    if not os.path.isabs(out):
        trainer.args.output_dir = os.path.join(_dt.scratch_dir(), out)
    if not any(isinstance(c, RayTrainReportCallback) for c in trainer.callback_handler.callbacks):
        trainer.add_callback(RayTrainReportCallback())
    train = trainer.train
    if getattr(train, "_durabletrain", False):
        return trainer

    def durable_train(resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint is None:
            from durabletrain import train as dtrain
            c = dtrain.get_checkpoint()
            if c is not None:
                for d in (os.path.join(c.path, RayTrainReportCallback.CHECKPOINT_NAME), c.path):
                    if os.path.exists(os.path.join(d, transformers.trainer.TRAINER_STATE_NAME)):
                        resume_from_checkpoint = d
                        break
        return train(resume_from_checkpoint, *args, **kwargs)

    durable_train._durabletrain = True  # type: ignore[attr-defined]
    trainer.train = durable_train
    return trainer

