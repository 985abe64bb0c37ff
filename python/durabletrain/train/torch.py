"""Ray Train's PyTorch API over durabletrain (``ray.train.torch`` → ``durabletrain.train.torch``).

``TorchTrainer(train_loop_per_worker, ...).fit()`` runs the function on
``num_workers`` ranks of a durabletrain run (a Temporal workflow), each a
process with torchrun's variables and its process group already set up
(gloo on a CPU slot, NCCL on a GPU one). Inside it, ``prepare_model`` and
``prepare_data_loader`` do what Ray's do, and the loader keeps its place:
a run resumed mid-epoch trains exactly the batches it had not.

Example (2 ranks on a local cluster that fit() starts by itself):
    >>> from durabletrain.train import ScalingConfig
    >>> def train_loop(config):
    ...     from durabletrain import train
    ...     train.report({"loss": 0.5})
    >>> trainer = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2))
    >>> trainer.fit().metrics["loss"]  # doctest: +SKIP
    0.5
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional

import durabletrain as _dt
from durabletrain import _session
from durabletrain._configs import RunConfig, ScalingConfig

__all__ = ["TorchTrainer", "TorchConfig", "prepare_model", "prepare_data_loader", "get_device", "get_devices"]


@dataclass
class TorchConfig:
    """Ray Train's TorchConfig: the process group's backend (None: NCCL on a
    GPU slot, gloo on a CPU one) and its timeout in seconds."""

    backend: Optional[str] = None
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError("TorchConfig.backend is %r; want \"gloo\", \"nccl\" or None" % (self.backend,))
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, int) or self.timeout_s < 1:
            raise ValueError("TorchConfig.timeout_s is %r; want a whole number of seconds of at least 1" % (self.timeout_s,))


def get_devices() -> list:
    return [get_device()]


def get_device() -> Any:
    """This rank's torch device: its GPU on a GPU slot, else the CPU."""
    return _dt.device()


def prepare_model(model: Any, move_to_device: bool = True, parallel_strategy: Optional[str] = "ddp",
                  parallel_strategy_kwargs: Optional[Dict[str, Any]] = None) -> Any:
    """Moves the model to this rank's device and, with more than one rank,
    wraps it in DistributedDataParallel (Ray Train's prepare_model)."""
    import torch
    if parallel_strategy not in ("ddp", None):
        raise ValueError("prepare_model: parallel_strategy is %r; want \"ddp\" or None (FSDP: durabletrain.lightning)" % (parallel_strategy,))
    device = get_device()
    if move_to_device:
        model = model.to(device)
    _session.model = model
    if parallel_strategy == "ddp" and _dt.world_size() > 1:
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group(backend=_dt.backend(), init_method="env://")
        kwargs = dict(parallel_strategy_kwargs or {})
        if device.type == "cuda":
            kwargs.setdefault("device_ids", [device.index or 0])
        model = torch.nn.parallel.DistributedDataParallel(model, **kwargs)
        _session.model = model
    return model


class _SkippingSampler:
    """DistributedSampler's order for this rank, less the first ``skip`` samples."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.skip = inner, 0

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        it = iter(self.inner)
        for _ in range(self.skip):
            next(it, None)
        return it

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip)


class _PreparedLoader:
    """A DataLoader over this rank's shard whose batches land on its device.

    Iterated while the prepared model trains (model.train()), within a
    durabletrain epoch, its batches are the epoch's steps: the gang may stop
    between two of them for a checkpoint or a preemption, and a run resumed
    mid-epoch skips the batches already trained. Iterated otherwise (an
    evaluation, model.eval()), it is a plain loader."""

    def __init__(self, loader: Any, sampler: Optional[_SkippingSampler], device: Any, move: bool) -> None:
        self._loader, self._skipper, self._device, self._move = loader, sampler, device, move
        self.sampler = sampler.inner if sampler is not None else loader.sampler
        self.dataset, self.batch_size = loader.dataset, loader.batch_size

    def __len__(self) -> int:
        return len(self._loader)

    def _to_device(self, batch: Any) -> Any:
        if not self._move:
            return batch
        import torch
        if isinstance(batch, torch.Tensor):
            return batch.to(self._device)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to_device(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self._to_device(v) for k, v in batch.items()}
        return batch

    def _training(self) -> bool:
        m = _session.model
        return (_session.active and _dt._epoch is not None and not _dt._in_steps
                and (m is None or getattr(m, "training", True)))

    def __iter__(self) -> Iterator[Any]:
        if not self._training():
            for batch in self._loader:
                yield self._to_device(batch)
            return
        start = _dt.start_step()
        if self._skipper is not None:
            self._skipper.skip = start * (self.batch_size or 1)
            batches: Any = iter(self._loader)
        else:
            batches = iter(self._loader)
            for _ in range(start):
                next(batches, None)
        try:
            for _step, batch in _dt.steps(_Sized(batches, len(self._loader) - start)):
                yield self._to_device(batch)
        finally:
            if self._skipper is not None:
                self._skipper.skip = 0
            _dt._start = 0  # the next iteration of this epoch's loader (if any) starts at its beginning


class _Sized:
    def __init__(self, it: Iterator[Any], n: int) -> None:
        self._it, self._n = it, max(0, n)

    def __iter__(self) -> Iterator[Any]:
        return self._it

    def __len__(self) -> int:
        return self._n


def prepare_data_loader(data_loader: Any, add_dist_sampler: bool = True, move_to_device: bool = True) -> Any:
    """This rank's shard of the loader's data set (a DistributedSampler that
    keeps the loader's shuffling), its batches on this rank's device (Ray
    Train's prepare_data_loader). Unlike Ray's, it keeps its place: see
    _PreparedLoader."""
    from torch.utils.data import DataLoader, RandomSampler
    from torch.utils.data.distributed import DistributedSampler
    skipper = None
    loader = data_loader
    if add_dist_sampler and not isinstance(data_loader.sampler, DistributedSampler) and getattr(data_loader, "batch_size", None):
        shuffle = isinstance(data_loader.sampler, RandomSampler)
        inner = DistributedSampler(data_loader.dataset, num_replicas=_dt.world_size(), rank=_dt.world_rank(), shuffle=shuffle)
        skipper = _SkippingSampler(inner)
        loader = DataLoader(data_loader.dataset, batch_size=data_loader.batch_size, sampler=skipper,
                            num_workers=data_loader.num_workers, collate_fn=data_loader.collate_fn, pin_memory=data_loader.pin_memory,
                            drop_last=data_loader.drop_last, timeout=data_loader.timeout, worker_init_fn=data_loader.worker_init_fn,
                            persistent_workers=getattr(data_loader, "persistent_workers", False))
    return _PreparedLoader(loader, skipper, get_device(), move_to_device)


class TorchTrainer:
    """Runs train_loop_per_worker on scaling_config.num_workers ranks of a
    durable durabletrain run (Ray Train's TorchTrainer).

    The function travels by value (cloudpickle), so one defined in a script's
    ``__main__`` or a notebook cell works as written; a string
    ``"module:function"`` names code already on the workers instead.
    ``train_loop_config`` is passed to it (and a Tuner's trial overrides its
    keys). ``fit()`` blocks until the run ends and returns its Result; a run
    of the same ``run_config.name`` that exists already is attached to.
    """

    def __init__(self, train_loop_per_worker: "Callable[..., Any] | str", *, train_loop_config: Optional[Dict[str, Any]] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 torch_config: Optional[TorchConfig] = None, datasets: Optional[Dict[str, Any]] = None,
                 resume_from_checkpoint: Any = None, working_dir: Optional[str] = None) -> None:
        from durabletrain import _driver
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise TypeError("TorchTrainer: torch_config is %r; want a durabletrain.train.torch.TorchConfig" % (torch_config,))
        self._job = _driver.Job(train_loop_per_worker, train_loop_config, scaling_config, run_config,
                                datasets=datasets, resume_from_checkpoint=resume_from_checkpoint, working_dir=working_dir,
                                framework="torch", owner="TorchTrainer")
        if torch_config is not None:
            self._job.extra_env["DTPY_TORCH_BACKEND"] = torch_config.backend or ""
            self._job.extra_env["DTPY_TORCH_TIMEOUT_S"] = str(torch_config.timeout_s)

    def fit(self) -> Any:
        """Starts the run (or attaches to the one of the same name), follows
        it, and returns its Result; raises TrainingFailedError if it failed."""
        return self._job.fit()

    def spec(self) -> Dict[str, Any]:
        """The spec fit() would start (TrainingWorkflow's input), checked."""
        return self._job.spec()
