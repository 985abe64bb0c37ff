"""Ray Train's Lightning integration over durabletrain (``ray.train.lightning`` → ``durabletrain.train.lightning``).

Inside a ``TorchTrainer``'s training function, a Lightning 2.x ``Trainer``
runs on the run's ranks as it does under Ray Train::

    trainer = pl.Trainer(max_epochs=5, devices="auto", accelerator="auto",
                         strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                         callbacks=[RayTrainReportCallback()], enable_checkpointing=False)
    trainer = prepare_trainer(trainer)
    trainer.fit(model, train_dataloaders=loader)

and durably by the step, which Ray's is not:

- Each Lightning epoch is one of the run's iterations: ``RayTrainReportCallback``
  reports ``trainer.callback_metrics`` and a checkpoint (``checkpoint.ckpt``,
  Lightning's own, written by ``trainer.save_checkpoint``) at its end.
- Between two training batches the gang may stop at a step every rank agrees
  on (``checkpoint.every_steps``, or a worker told to shut down): every rank
  then saves a Lightning checkpoint at that batch, and the run resumes there.
- ``prepare_trainer`` makes ``trainer.fit`` resume from the run's checkpoint
  when it is given no ``ckpt_path`` (Ray's code that passes one from
  ``get_checkpoint()`` works unchanged), and the strategy's training loader
  skips the batches the epoch had already trained: a run resumed mid-epoch
  trains exactly the batches of an unbroken one, none twice.

Example (the names Ray's users import, with ``ray.train`` replaced):
    >>> from durabletrain.train.lightning import RayDDPStrategy, RayTrainReportCallback
    >>> RayTrainReportCallback.CHECKPOINT_NAME
    'checkpoint.ckpt'
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import warnings
from typing import Any, Dict, Iterator, Optional

import durabletrain as _dt
from durabletrain import _session

try:
    import lightning.pytorch as pl
    from lightning.fabric.plugins.environments import TorchElasticEnvironment
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
except ImportError:  # the standalone package of the same code
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from lightning_fabric.plugins.environments import TorchElasticEnvironment  # type: ignore[no-redef]
    from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy  # type: ignore[no-redef]

__all__ = ["RayDDPStrategy", "RayFSDPStrategy", "RayLightningEnvironment", "RayTrainReportCallback", "prepare_trainer"]

CHECKPOINT_NAME = "checkpoint.ckpt"


class RayLightningEnvironment(TorchElasticEnvironment):
    """The rank's place in the gang, from the variables its worker sets
    (torchrun's: RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK, MASTER_ADDR,
    MASTER_PORT). The processes are the worker's, never Lightning's."""

    @staticmethod
    def detect() -> bool:
        return all(v in os.environ for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        pass  # Trainer(devices=, num_nodes=) describe one host's slots; the gang is the worker's

    def set_world_size(self, size: int) -> None:
        pass  # the gang's, not Trainer(devices, num_nodes)'s

    def set_global_rank(self, rank: int) -> None:
        pass


def _resumable(strategy: Any, dataloader: Any) -> Any:
    """The training loader, made to skip the batches a resumed epoch has
    already trained (see _SkipTrained)."""
    sampler = getattr(getattr(dataloader, "batch_sampler", None), "sampler", None)
    if sampler is not None and not isinstance(sampler, _SkipTrained):
        dataloader.batch_sampler.sampler = _SkipTrained(sampler, dataloader.batch_sampler.batch_size)
    elif sampler is None:
        return _SkipTrainedBatches(dataloader)
    return dataloader


def _skip_now() -> int:
    """Batches of the current epoch already trained, to skip once: the run
    resumed there (the worker's start step); 0 once taken."""
    skip = _dt._start if (_session.active and _dt._epoch is not None and _dt._epoch not in _skipped) else 0
    if _dt._epoch is not None:
        _skipped.add(_dt._epoch)
    return skip


_skipped: set = set()


class _SkipTrained:
    """A training sampler (Lightning's DistributedSampler, or the loader's
    own) less the samples of the batches a resumed epoch already trained,
    so its batches are the unbroken epoch's from there on. Its length stays
    the whole epoch's: Lightning counts the epoch's batches from it, and
    resumes its own count at the checkpoint's batch."""

    def __init__(self, inner: Any, batch_size: int) -> None:
        self.inner, self.batch_size = inner, batch_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.inner)
        for _ in range(_skip_now() * self.batch_size):
            next(it, None)
        return it

    def __len__(self) -> int:
        return len(self.inner)


class _SkipTrainedBatches:
    """A loader without a sampler to skip in (an iterable data set): its
    first batches are read and dropped instead."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self._loader)
        for _ in range(_skip_now()):
            next(it, None)
        return it


class _DurableStrategy:
    """What both strategies add to Lightning's: the rank's device and the
    gang's sampler from the worker, and a training loader that resumes."""

    @property
    def root_device(self) -> Any:
        return _dt.device()

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return dict(num_replicas=_dt.world_size(), rank=_dt.world_rank())

    def process_dataloader(self, dataloader: Any) -> Any:
        dataloader = super().process_dataloader(dataloader)  # type: ignore[misc]
        trainer = getattr(getattr(self, "lightning_module", None), "_trainer", None)
        if trainer is not None and trainer.training:
            return _resumable(self, dataloader)
        return dataloader

    def _configure_launcher(self) -> None:
        # Lightning's own detection of torchrun's variables (no plugins=
        # given) checks Trainer(devices * num_nodes) against the gang.
        if type(self.cluster_environment) is TorchElasticEnvironment:
            self.cluster_environment = RayLightningEnvironment()
        super()._configure_launcher()  # type: ignore[misc]

    def setup(self, trainer: Any) -> None:
        _attach(trainer)
        super().setup(trainer)  # type: ignore[misc]


class RayDDPStrategy(_DurableStrategy, DDPStrategy):
    """Lightning's DDPStrategy on the run's gang (Ray Train's RayDDPStrategy)."""


class RayFSDPStrategy(_DurableStrategy, FSDPStrategy):
    """Lightning's FSDPStrategy on the run's gang (Ray Train's
    RayFSDPStrategy): the model's parameters, gradients and optimizer state
    sharded over the ranks. On CPU slots too (gloo): Lightning's FSDP asks
    for an accelerator, and torch's FSDP runs on CPU when told the device.

    ``state_dict_type="sharded"`` has every rank save its own part of each
    checkpoint (torch.distributed.checkpoint's directory): run it with
    ``CheckpointConfig(sharded=True)``, so that every rank's part is kept and
    every rank is handed the whole on resume. The default, ``"full"``,
    gathers the whole state on rank 0, which saves it alone."""

    def _setup_model(self, model: Any) -> Any:
        if self.root_device.type != "cpu":
            return super()._setup_model(model)
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel
        from lightning.pytorch.strategies import fsdp as _fsdp
        if not any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            model = FullyShardedDataParallel(module=model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
                                             sharding_strategy=self.sharding_strategy, device_id=torch.device("cpu"), **self.kwargs)
        _fsdp._setup_activation_checkpointing(model, self._activation_checkpointing_kwargs)
        return model

    # Lightning's FSDP saves and loads at rank 0's path, broadcast to every
    # rank (a file system every rank shares). Each rank's checkpoint
    # directory here is its own, on its own host: each saves its part into
    # its own, and loads from its own (the run hands it every rank's part).
    _own_paths = False

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._own_paths:
            return obj
        return super().broadcast(obj, src)

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath: Any, storage_options: Optional[Any] = None) -> None:
        self._own_paths = True
        try:
            super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        finally:
            self._own_paths = False

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        self._own_paths = True
        try:
            return super().load_checkpoint(checkpoint_path, *args, **kwargs)
        finally:
            self._own_paths = False


class RayTrainReportCallback(pl.Callback):
    """Reports each epoch's ``trainer.callback_metrics`` with a checkpoint of
    the whole trainer (``checkpoint.ckpt``) at the epoch's end (Ray Train's
    RayTrainReportCallback), and keeps the gang's steps: between two training
    batches the run may stop every rank at an agreed batch, save there, and
    resume there."""

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(self) -> None:
        super().__init__()
        self._dir: Optional[str] = None
        self._checked_resume = False

    # -- the steps --------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if not _session.active or _dt._epoch is None:
            return
        if not self._checked_resume:
            self._checked_resume = True
            if batch_idx != _dt._start:
                raise SystemExit("durabletrain.train.lightning: Lightning resumed epoch %d at batch %d, but the run's checkpoint is at "
                                 "step %d of it: call trainer.fit without ckpt_path (prepare_trainer resumes from the run's "
                                 "checkpoint), or with train.get_checkpoint()'s %s" % (trainer.current_epoch, batch_idx, _dt._start, CHECKPOINT_NAME))
        if trainer.current_epoch != _dt._epoch:
            raise SystemExit("durabletrain.train.lightning: Lightning trains epoch %d where the run is at epoch %d: one Lightning epoch "
                             "is one report of the run; is RayTrainReportCallback in Trainer(callbacks=...)?" % (trainer.current_epoch, _dt._epoch))
        _dt._in_steps = True
        total = trainer.num_training_batches
        _dt._steps_total = int(total) if total != float("inf") else 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not _session.active or _dt._epoch is None:
            return
        _dt._step = batch_idx + 1
        every = max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
        if _dt._step % every == 0 and _dt._channel() is not None:
            metrics = _metrics(trainer)
            if metrics:
                _dt.report(metrics)
        if _dt._sync and _dt._step >= _dt._sync and _dt._sock is not None and not trainer.fit_loop.epoch_loop._should_accumulate():
            _dt._synchronise(lambda: self._save(trainer))

    # -- the epochs -------------------------------------------------------

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        _dt._in_steps = False
        metrics = dict(_metrics(trainer), epoch=trainer.current_epoch, step=trainer.global_step)
        d = self._save(trainer)
        from durabletrain import train
        train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))

    def _save(self, trainer: Any) -> str:
        """A checkpoint of the whole trainer at this point, in this rank's
        own directory (every rank calls it: under DDP rank 0 writes the file;
        under FSDP's sharded state each rank writes its part)."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="lightning-", dir=_dt.scratch_dir())
        shutil.rmtree(self._dir, ignore_errors=True)
        os.makedirs(self._dir)
        trainer.save_checkpoint(os.path.join(self._dir, CHECKPOINT_NAME))
        return self._dir


def _metrics(trainer: Any) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for k, v in trainer.callback_metrics.items():
        try:
            out[k] = float(v.item() if hasattr(v, "item") else v)
        except (TypeError, ValueError, RuntimeError):
            continue
    return out


def _attach(trainer: Any) -> None:
    """The run's report callback on the trainer, once."""
    if not any(isinstance(c, RayTrainReportCallback) for c in trainer.callbacks):
        trainer.callbacks.append(RayTrainReportCallback())


def prepare_trainer(trainer: Any) -> Any:
    """Checks the trainer and makes it durable (Ray Train's prepare_trainer):
    its strategy must be RayDDPStrategy or RayFSDPStrategy (a plain one would
    train every rank alone, or on the wrong shard, and would not resume
    mid-epoch on the batches not trained), its report callback is
    added if missing, and ``trainer.fit`` without a ``ckpt_path`` resumes
    from the run's checkpoint."""
    if not isinstance(trainer.strategy, _DurableStrategy):
        raise ValueError("prepare_trainer: Trainer(strategy=%s); want strategy=RayDDPStrategy() or RayFSDPStrategy() from "
                         "durabletrain.train.lightning (this run has %d ranks)" % (type(trainer.strategy).__name__, _dt.world_size()))
    _attach(trainer)
    fit = trainer.fit
    if getattr(fit, "_durabletrain", False):
        return trainer

    def durable_fit(model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, datamodule: Any = None,
                    ckpt_path: Optional[str] = None, **kwargs: Any) -> Any:
        if ckpt_path is None:
            from durabletrain import train
            c = train.get_checkpoint()
            if c is not None and os.path.exists(os.path.join(c.path, CHECKPOINT_NAME)):
                ckpt_path = os.path.join(c.path, CHECKPOINT_NAME)
        with warnings.catch_warnings():
            # The strategy's training loader skips what a resumed epoch trained.
            warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch ended.*")
            return fit(model, train_dataloaders=train_dataloaders, val_dataloaders=val_dataloaders, datamodule=datamodule,
                       ckpt_path=ckpt_path, **kwargs)

    durable_fit._durabletrain = True  # type: ignore[attr-defined]
    trainer.fit = durable_fit
    return trainer
