"""The run's configs, as Ray Train names them, and how they become a spec.

Each config checks its own fields when it is made and raises a ValueError
(TypeError for a wrong type) that names the field and what is accepted, so
a malformed config fails in the driver before anything starts; the spec
they make is then checked by the Go side's own validation (``starter
check``) before the run is started.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

#: The most ranks a run may ask for (the Go side's spec.MaxWorkers).
MAX_WORKERS = 8192
#: The most report() iterations a run may have (the Go side's spec.MaxEpochs).
MAX_ITERATIONS = 100000


def _check_int(owner: str, name: str, value: Any, low: int, high: Optional[int] = None, allow_none: bool = False) -> None:
    where = "%s.%s" % (owner, name)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s is %r (%s); want a whole number%s" % (where, value, type(value).__name__, _range(low, high)))
    if value < low or (high is not None and value > high):
        raise ValueError("%s is %r; want a whole number%s" % (where, value, _range(low, high)))


def _range(low: int, high: Optional[int]) -> str:
    return " from %d to %d" % (low, high) if high is not None else " of at least %d" % low


def _check_seconds(owner: str, name: str, value: Any) -> None:
    if value is None:
        return
    where = "%s.%s" % (owner, name)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError("%s is %r; want a number of seconds above 0, such as 10" % (where, value))


def _seconds(value: float) -> str:
    return "%dms" % round(value * 1000)


@dataclass
class ScalingConfig:
    """How many ranks train and on what (Ray Train's ScalingConfig).

    Example:
        >>> ScalingConfig(num_workers=2).num_workers
        2
    """

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, float]] = None
    #: Ranks per host: a gang of hosts of this many ranks each (durabletrain's scaling.workers_per_host).
    workers_per_host: Optional[int] = None
    #: Train on as few as this many ranks while the others are lost (elastic; scaling.min_workers).
    min_workers: Optional[int] = None
    #: The GPU agents' task queue (scaling.task_queue); None: the cluster's.
    task_queue: Optional[str] = None
    #: How long the gang may take to form, in seconds (scaling.gang_timeout).
    gang_timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        _check_int("ScalingConfig", "num_workers", self.num_workers, 1, MAX_WORKERS)
        if not isinstance(self.use_gpu, bool):
            raise TypeError("ScalingConfig.use_gpu is %r; want True or False" % (self.use_gpu,))
        _check_int("ScalingConfig", "workers_per_host", self.workers_per_host, 1, 64, allow_none=True)
        _check_int("ScalingConfig", "min_workers", self.min_workers, 1, self.num_workers, allow_none=True)
        if self.task_queue is not None and (not isinstance(self.task_queue, str) or not self.task_queue):
            raise ValueError("ScalingConfig.task_queue is %r; want the GPU agents' task queue name, or None" % (self.task_queue,))
        _check_seconds("ScalingConfig", "gang_timeout_s", self.gang_timeout_s)
        if self.resources_per_worker is not None:
            if not isinstance(self.resources_per_worker, Mapping):
                raise TypeError("ScalingConfig.resources_per_worker is %r; want a dict such as {\"GPU\": 1}" % (self.resources_per_worker,))
            for k, v in self.resources_per_worker.items():
                if k not in ("CPU", "GPU"):
                    raise ValueError("ScalingConfig.resources_per_worker has %r; want only \"CPU\" and \"GPU\" "
                                     "(a worker's slots are its GPUs, or its CPU slots)" % (k,))
                if isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0 or (k == "GPU" and v != int(v)):
                    raise ValueError("ScalingConfig.resources_per_worker[%r] is %r; want %s" % (
                        k, v, "a whole number of GPUs per rank" if k == "GPU" else "a number of CPUs of at least 0"))

    @property
    def gpus_per_worker(self) -> int:
        if self.resources_per_worker and self.resources_per_worker.get("GPU"):
            return int(self.resources_per_worker["GPU"])
        return 1

    def to_spec(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"workers": self.num_workers}
        if self.gpus_per_worker != 1:
            out["gpus_per_worker"] = self.gpus_per_worker
        if self.workers_per_host:
            out["workers_per_host"] = self.workers_per_host
        if self.min_workers:
            out["min_workers"] = self.min_workers
        if self.task_queue:
            out["task_queue"] = self.task_queue
        if self.gang_timeout_s:
            out["gang_timeout"] = _seconds(self.gang_timeout_s)
        return out


@dataclass
class CheckpointConfig:
    """Which checkpoints a run keeps (Ray Train's CheckpointConfig).

    Example:
        >>> CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc").checkpoint_score_order
        'max'
    """

    #: The newest N (or, with checkpoint_score_attribute, the best N) are kept; None: durabletrain's default (2).
    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    #: A checkpoint every this many report() iterations (checkpoint.every_epochs).
    checkpoint_frequency: Optional[int] = None
    #: A checkpoint every this many steps inside an iteration (checkpoint.every_steps: the
    #: batches of a prepared data loader, of a Lightning or Hugging Face trainer), where the
    #: program can save there; None: only where it reports one, and at a preemption.
    checkpoint_every_steps: Optional[int] = None
    #: Every rank's reported directory is part of each checkpoint, not rank 0's alone, and every
    #: rank resumes from all of them merged into one directory (checkpoint.sharded and
    #: checkpoint.merge_shards): Ray Train's distributed checkpoints, for a model sharded over the
    #: ranks (Lightning's RayFSDPStrategy(state_dict_type="sharded"), torch.distributed.checkpoint).
    #: A file two ranks write must then hold the same bytes. The run resumes at the world size
    #: that saved it (ScalingConfig.min_workers is num_workers) and checkpoints every iteration.
    sharded: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.sharded, bool):
            raise ValueError("CheckpointConfig.sharded is %r; want True or False" % (self.sharded,))
        _check_int("CheckpointConfig", "num_to_keep", self.num_to_keep, 1, allow_none=True)
        _check_int("CheckpointConfig", "checkpoint_frequency", self.checkpoint_frequency, 1, allow_none=True)
        _check_int("CheckpointConfig", "checkpoint_every_steps", self.checkpoint_every_steps, 1, allow_none=True)
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError("CheckpointConfig.checkpoint_score_order is %r; want \"max\" or \"min\"" % (self.checkpoint_score_order,))
        if self.checkpoint_score_attribute is not None and (not isinstance(self.checkpoint_score_attribute, str) or not self.checkpoint_score_attribute):
            raise ValueError("CheckpointConfig.checkpoint_score_attribute is %r; want the name of a metric your function reports" % (
                self.checkpoint_score_attribute,))

    def to_spec(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.checkpoint_frequency:
            out["every_epochs"] = self.checkpoint_frequency
        if self.checkpoint_every_steps:
            out["every_steps"] = self.checkpoint_every_steps
        if self.sharded:
            out["sharded"] = True
            out["merge_shards"] = True
        if self.checkpoint_score_attribute:
            out["keep_best"] = self.num_to_keep or 1
            out["score"] = self.checkpoint_score_attribute
            out["mode"] = self.checkpoint_score_order
            out["keep_last"] = 1  # the newest, to resume from
        elif self.num_to_keep:
            out["keep_last"] = self.num_to_keep
        return out


@dataclass
class FailureConfig:
    """How many failures a run survives (Ray Train's FailureConfig).

    A worker that dies or hangs is a failure, charged to max_failures; a
    worker told to stop (SIGTERM, a preemption) is not.

    Example:
        >>> FailureConfig(max_failures=0).max_failures
        0
    """

    max_failures: int = 3
    #: A rank silent this long, in seconds, is lost (failure.heartbeat_timeout); None: 10.
    heartbeat_timeout_s: Optional[float] = None
    #: Preemptions tolerated (failure.max_preemptions); None: 20.
    max_preemptions: Optional[int] = None
    #: Every rank keeps a spare process on its worker, its interpreter up and
    #: PyTorch imported, so that a new gang after a failure trains again about
    #: 2 s sooner; the cost is an idle process per rank (exec.warm_spare).
    warm_spares: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.warm_spares, bool):
            raise ValueError("FailureConfig.warm_spares is %r; want True or False" % (self.warm_spares,))
        if self.max_failures == -1:  # Ray's "retry forever"
            self.max_failures = 10000
        _check_int("FailureConfig", "max_failures", self.max_failures, 0, 10000)
        _check_int("FailureConfig", "max_preemptions", self.max_preemptions, 0, 10000, allow_none=True)
        _check_seconds("FailureConfig", "heartbeat_timeout_s", self.heartbeat_timeout_s)

    def to_spec(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"max_failures": self.max_failures}
        if self.max_preemptions is not None:
            out["max_preemptions"] = self.max_preemptions
        if self.heartbeat_timeout_s:
            out["heartbeat_timeout"] = _seconds(self.heartbeat_timeout_s)
        return out


@dataclass
class RunConfig:
    """Where a run keeps its checkpoints and how it ends (Ray Train's RunConfig).

    ``name`` is the run's workflow ID: ``fit()`` again with the same name
    attaches to the run (or its result) instead of starting another.
    ``storage_path`` is a local directory or a gocloud.dev/blob URL
    (file://, s3://, gs://, azblob://); None: the cluster's.
    ``stop={"training_iteration": N}`` ends a run after N reports.

    Example:
        >>> RunConfig(name="exp", stop={"training_iteration": 3}).stop
        {'training_iteration': 3}
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    stop: Optional[Dict[str, Any]] = None
    #: 0: silent; 1: a line per report and per incident; in Jupyter, a live table and plot.
    verbose: int = 1
    #: Ray's callbacks: ``MLflowLoggerCallback`` (durabletrain.air.integrations.mlflow),
    #: which the run's workers carry out, so that it logs also when the driver is gone.
    callbacks: Optional[List[Any]] = None

    def __post_init__(self) -> None:
        self.callbacks = _check_callbacks(self.callbacks)
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name or len(self.name) > 200 or any(c in self.name for c in "/\\\n\r\t"):
                raise ValueError("RunConfig.name is %r; want a name of 1 to 200 characters without slashes or line breaks" % (self.name,))
        if self.storage_path is not None and (not isinstance(self.storage_path, str) or not self.storage_path):
            raise ValueError("RunConfig.storage_path is %r; want a directory or a blob URL (file://, s3://, gs://, azblob://)" % (
                self.storage_path,))
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError("RunConfig.checkpoint_config is %r; want a CheckpointConfig" % (self.checkpoint_config,))
        if not isinstance(self.failure_config, FailureConfig):
            raise TypeError("RunConfig.failure_config is %r; want a FailureConfig" % (self.failure_config,))
        if self.stop is not None:
            if not isinstance(self.stop, Mapping):
                raise TypeError("RunConfig.stop is %r; want a dict such as {\"training_iteration\": 10}" % (self.stop,))
            for k in self.stop:
                if k != "training_iteration":
                    raise ValueError("RunConfig.stop has %r; want only \"training_iteration\" (a run's function decides "
                                     "when else to stop: it returns)" % (k,))
            _check_int("RunConfig", "stop[\"training_iteration\"]", self.stop["training_iteration"], 1, MAX_ITERATIONS)
        _check_int("RunConfig", "verbose", self.verbose, 0, 2)

    @property
    def mlflow(self) -> Any:
        """The MLflowLoggerCallback among the callbacks, or None."""
        from durabletrain.air.integrations.mlflow import MLflowLoggerCallback
        for cb in self.callbacks or ():
            if isinstance(cb, MLflowLoggerCallback):
                return cb
        return None

    @property
    def max_iterations(self) -> int:
        if self.stop:
            return int(self.stop["training_iteration"])
        return MAX_ITERATIONS


def _check_callbacks(callbacks: Any) -> Optional[List[Any]]:
    if callbacks is None:
        return None
    from durabletrain.air.integrations.mlflow import MLflowLoggerCallback
    if isinstance(callbacks, (str, bytes, Mapping)) or not hasattr(callbacks, "__iter__"):
        raise TypeError("RunConfig.callbacks is %r; want a list such as [MLflowLoggerCallback(...)]" % (callbacks,))
    out = list(callbacks)
    seen = False
    for i, cb in enumerate(out):
        if not isinstance(cb, MLflowLoggerCallback):
            raise ValueError("RunConfig.callbacks[%d] is %r; durabletrain carries out MLflowLoggerCallback "
                             "(durabletrain.air.integrations.mlflow) only: a callback of your own would run in a driver "
                             "the run outlives; report from the train function instead" % (i, cb))
        if seen:
            raise ValueError("RunConfig.callbacks[%d] is a second MLflowLoggerCallback; want one (a run is logged to one "
                             "tracking server)" % i)
        seen = True
    return out


def replace(config: Any, **changes: Any) -> Any:
    """A copy of a config with some fields changed, checked again."""
    return dataclasses.replace(config, **changes)
