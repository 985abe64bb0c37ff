"""Ray Train's API over durabletrain (``ray.train`` → ``durabletrain.train``).

Driver side: the configs (ScalingConfig, RunConfig, CheckpointConfig,
FailureConfig), ``durabletrain.train.torch.TorchTrainer`` and what its
``fit()`` returns (Result, or TrainingFailedError). Rank side, inside the
training function: ``report``, ``get_checkpoint``, ``get_context``,
``Checkpoint``.

Example (a function that runs as one rank without any cluster, too):
    >>> import tempfile, os
    >>> from durabletrain import train
    >>> def train_loop(config):
    ...     for epoch in range(config["epochs"]):
    ...         with tempfile.TemporaryDirectory() as d:
    ...             open(os.path.join(d, "w"), "w").write(str(epoch))
    ...             train.report({"loss": 1.0 / (epoch + 1)}, checkpoint=train.Checkpoint.from_directory(d))
    >>> train.get_context().get_world_size()
    1
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from durabletrain import _session
from durabletrain._configs import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig

__all__ = ["ScalingConfig", "RunConfig", "CheckpointConfig", "FailureConfig", "Checkpoint", "Result", "TrainingFailedError",
           "report", "get_checkpoint", "get_context", "TrainContext"]


class TrainingFailedError(RuntimeError):
    """A run that ended failed, or cancelled, or could not start: the message
    says why, ``result`` holds what it had (its checkpoints are kept)."""

    def __init__(self, message: str, result: Optional["Result"] = None) -> None:
        super().__init__(message)
        self.result = result


class Checkpoint:
    """A directory of files: one a rank wrote (``from_directory``), or one the
    run stored (``Result.checkpoint``), read back verified.

    Example:
        >>> c = Checkpoint.from_directory(".")
        >>> with c.as_directory() as d:
        ...     os.path.isdir(d)
        True
    """

    def __init__(self, path: Optional[str] = None, *, url: Optional[str] = None, run: Optional[str] = None,
                 id: Optional[str] = None, epoch: int = 0, step: int = 0, metrics: Optional[Dict[str, float]] = None) -> None:
        if path is None and not (url and run and id):
            raise ValueError("Checkpoint: want a path (Checkpoint.from_directory) or a stored checkpoint's url, run and id")
        self._path, self.url, self.run, self.id = path, url, run, id
        self.epoch, self.step = epoch, step
        self.metrics = dict(metrics or {})

    @classmethod
    def from_directory(cls, path: "os.PathLike[str] | str") -> "Checkpoint":
        p = os.fspath(path)
        if not os.path.isdir(p):
            raise ValueError("Checkpoint.from_directory: %r is not a directory" % (p,))
        return cls(os.path.abspath(p))

    @property
    def path(self) -> str:
        """The local directory, or where the run stored it (URL/run/ID)."""
        if self._path is not None:
            return self._path
        return "%s/%s/%s" % (self.url.split("?")[0].rstrip("/"), self.run, self.id)

    @property
    def stored(self) -> bool:
        return self._path is None

    def to_directory(self, path: Optional[str] = None) -> str:
        """Writes the checkpoint's files into path (a new temporary directory
        if None), verified against its manifest first, and returns it."""
        dest = os.path.abspath(path) if path else tempfile.mkdtemp(prefix="durabletrain-checkpoint-")
        if self._path is not None:
            shutil.copytree(self._path, dest, dirs_exist_ok=True)
            return dest
        from durabletrain import _binaries
        out = subprocess.run([_binaries.find("starter"), "extract", "-url", self.url, "-run", self.run, "-id", self.id, "-to", dest],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError("checkpoint %s: %s" % (self.path, (out.stderr or out.stdout).strip()))
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """The checkpoint as a local directory for the block's length."""
        if self._path is not None:
            yield self._path
            return
        d = self.to_directory()
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def __repr__(self) -> str:
        return "Checkpoint(%s)" % self.path


@dataclass
class Result:
    """What a run ended with (Ray Train's Result).

    ``metrics``: the last report's (with ``training_iteration``);
    ``checkpoint``: the newest verified one; ``best_checkpoints``: (checkpoint,
    metrics) pairs kept by CheckpointConfig; ``metrics_dataframe``: every
    report, as a pandas DataFrame where pandas is installed; ``error``: why it
    failed, or None; ``path``: where its checkpoints are; ``incidents``:
    what happened to it (a lost rank, a preemption, a restore).
    """

    metrics: Dict[str, float]
    checkpoint: Optional[Checkpoint]
    path: str
    name: str
    state: str
    error: Optional[Exception] = None
    best_checkpoints: List[Tuple[Checkpoint, Dict[str, float]]] = field(default_factory=list)
    metrics_history: List[Dict[str, float]] = field(default_factory=list)
    incidents: List[Dict[str, Any]] = field(default_factory=list)
    failures: int = 0
    preemptions: int = 0
    progress: Dict[str, Any] = field(default_factory=dict)

    @property
    def metrics_dataframe(self) -> Any:
        try:
            import pandas
        except ImportError:
            return None
        return pandas.DataFrame(self.metrics_history)

    @property
    def config(self) -> Dict[str, Any]:
        return dict(self.progress.get("config") or {})


@dataclass
class TrainContext:
    """Where this rank stands (Ray Train's TrainContext), from torchrun's variables."""

    def _int(self, name: str, default: int) -> int:
        try:
            return int(os.environ.get(name, default))
        except ValueError:
            return default

    def get_world_rank(self) -> int:
        return self._int("RANK", 0)

    def get_world_size(self) -> int:
        return self._int("WORLD_SIZE", 1)

    def get_local_rank(self) -> int:
        return self._int("LOCAL_RANK", 0)

    def get_local_world_size(self) -> int:
        return self._int("LOCAL_WORLD_SIZE", 1)

    def get_node_rank(self) -> int:
        return self._int("GROUP_RANK", self._int("NODE_RANK", 0))

    def get_experiment_name(self) -> str:
        return os.environ.get("TORCHELASTIC_RUN_ID", "")

    get_trial_name = get_experiment_name

    def get_storage(self) -> str:
        return os.environ.get("DTPY_STORAGE", "")


def get_context() -> TrainContext:
    return TrainContext()


def report(metrics: Dict[str, Any], checkpoint: Optional[Checkpoint] = None) -> None:
    """Reports metrics and, optionally, a checkpoint (Ray Train's report).

    Every rank calls it at the same points. Outside a prepared data loader's
    loop it ends one iteration (durabletrain's epoch); inside the loop it is a
    report at that step, and with a checkpoint the gang checkpoints there.
    Rank 0's checkpoint is the run's. It returns once the checkpoint is
    taken: the directory may be deleted then."""
    d = None
    if checkpoint is not None:
        if not isinstance(checkpoint, Checkpoint) or checkpoint.stored:
            raise TypeError("durabletrain.train.report: checkpoint is %r; want Checkpoint.from_directory(a directory you wrote)" % (checkpoint,))
        d = checkpoint.path
    _session.report(metrics, d)


def get_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint this rank resumes from (the newest the run reported, or
    the one a preemption saved), or None for a fresh start."""
    d = os.environ.get("DURABLETRAIN_CHECKPOINT_DIR")
    if not d or not os.path.isdir(d):
        return None
    c = Checkpoint(d)
    c.epoch = int(os.environ.get("DURABLETRAIN_START_EPOCH", "0") or 0)
    c.step = int(os.environ.get("DURABLETRAIN_START_STEP", "0") or 0)
    return c


_FRAMEWORKS = ("torch", "lightning", "xgboost", "huggingface")


def __getattr__(name: str) -> Any:
    """The framework modules (``durabletrain.train.torch``, ``.lightning``,
    ``.xgboost``, ``.huggingface``) import on first use, so that
    ``import durabletrain as ray`` reaches ``ray.train.lightning`` as a Ray
    script's ``import ray.train.lightning`` does; each needs its framework
    installed, and only when used."""
    if name in _FRAMEWORKS:
        import importlib
        return importlib.import_module("durabletrain.train." + name)
    raise AttributeError("module 'durabletrain.train' has no attribute %r" % (name,))
