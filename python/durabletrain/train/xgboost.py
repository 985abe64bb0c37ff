"""Ray Train's XGBoost API over durabletrain (``ray.train.xgboost`` → ``durabletrain.train.xgboost``).

``XGBoostTrainer(train_loop_per_worker, ...).fit()`` runs the function on
``num_workers`` ranks, each inside XGBoost's own collective (its tracker on
rank 0's host, at the port the gang agreed on), so ``xgboost.train`` on
each rank's rows is one data-parallel model::

    def train_fn(config):
        checkpoint = train.get_checkpoint()
        start = RayTrainReportCallback.get_model(checkpoint) if checkpoint else None
        rounds = config["rounds"] - (start.num_boosted_rounds() if start else 0)
        dtrain = xgboost.DMatrix(x_of_this_rank, label=y_of_this_rank)
        xgboost.train(params, dtrain, num_boost_round=rounds, xgb_model=start, evals=[(dtrain, "train")],
                      callbacks=[RayTrainReportCallback(frequency=5)])

Durable by the boosting round: the rounds are the steps of the run's one
iteration. Each round's evaluation metrics are reported (``train-rmse``,
``validation-logloss``, or the names ``metrics=`` maps them to); the booster
is checkpointed every ``frequency`` rounds, at
``CheckpointConfig(checkpoint_every_steps=N)``, at a preemption's common
round and at the end, so a lost worker resumes at the last saved round.

Example:
    >>> RayTrainReportCallback.CHECKPOINT_NAME
    'model.ubj'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import xgboost

import durabletrain as _dt
from durabletrain import _session
from durabletrain._configs import RunConfig, ScalingConfig

__all__ = ["XGBoostTrainer", "XGBoostConfig", "RayTrainReportCallback"]


class XGBoostConfig:
    """Ray Train's XGBoostConfig: the collective's timeout, in seconds."""

    def __init__(self, timeout_s: int = 300) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
            raise ValueError("XGBoostConfig.timeout_s is %r; want a whole number of seconds of at least 1" % (timeout_s,))
        self.timeout_s = timeout_s


class XGBoostTrainer:
    """Runs train_loop_per_worker on scaling_config.num_workers ranks of a
    durable run, inside XGBoost's collective (Ray Train's XGBoostTrainer).
    See durabletrain.train.torch.TorchTrainer for the rest: the function
    travels by value, fit() blocks and returns the Result, a run of the same
    name is attached to."""

    def __init__(self, train_loop_per_worker: "Callable[..., Any] | str", *, train_loop_config: Optional[Dict[str, Any]] = None,
                 xgboost_config: Optional[XGBoostConfig] = None, scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None, datasets: Optional[Dict[str, Any]] = None,
                 resume_from_checkpoint: Any = None, working_dir: Optional[str] = None) -> None:
        from durabletrain import _driver
        if xgboost_config is not None and not isinstance(xgboost_config, XGBoostConfig):
            raise TypeError("XGBoostTrainer: xgboost_config is %r; want a durabletrain.train.xgboost.XGBoostConfig" % (xgboost_config,))
        self._job = _driver.Job(train_loop_per_worker, train_loop_config, scaling_config, run_config, datasets=datasets,
                                resume_from_checkpoint=resume_from_checkpoint, working_dir=working_dir,
                                framework="xgboost", owner="XGBoostTrainer")
        self._job.extra_env["DTPY_XGBOOST_TIMEOUT_S"] = str((xgboost_config or XGBoostConfig()).timeout_s)

    def fit(self) -> Any:
        return self._job.fit()

    def spec(self) -> Dict[str, Any]:
        return self._job.spec()


@contextlib.contextmanager
def collective() -> Iterator[None]:
    """XGBoost's collective over the gang, for the function's length: rank 0
    runs the tracker at MASTER_ADDR:MASTER_PORT, and every rank joins it as
    the task of its rank. One rank alone needs none."""
    world, rank = _dt.world_size(), _dt.world_rank()
    if world <= 1:
        yield
        return
    from xgboost import collective as coll
    from xgboost.tracker import RabitTracker
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = int(os.environ.get("DTPY_XGBOOST_TIMEOUT_S", "300"))
    tracker = None
    if rank == 0:
        tracker = RabitTracker(n_workers=world, host_ip=host, port=port, sortby="task", timeout=timeout)
        tracker.start()
    with coll.CommunicatorContext(dmlc_communicator="rabit", dmlc_tracker_uri=host, dmlc_tracker_port=port,
                                  dmlc_task_id=str(rank), dmlc_retry=max(3, timeout // 2), dmlc_timeout=timeout):
        yield
    if tracker is not None:
        tracker.wait_for(timeout)


class RayTrainReportCallback(xgboost.callback.TrainingCallback):
    """Reports each boosting round's evaluation metrics and checkpoints the
    booster (Ray Train's RayTrainReportCallback for XGBoost), keeping the
    gang's rounds: the run may stop every rank after an agreed round, save
    the booster there and resume there.

    ``metrics``: the names to report, as XGBoost's (``"validation-rmse"``), a
    list of them, or a dict of the names to report them as; None: all.
    ``frequency``: a checkpoint every this many rounds (0: none but those the
    run asks for and the last). ``checkpoint_at_end``: the final booster is
    the iteration's checkpoint."""

    CHECKPOINT_NAME = "model.ubj"

    def __init__(self, metrics: Optional[Union[str, List[str], Dict[str, str]]] = None, filename: str = CHECKPOINT_NAME,
                 frequency: int = 0, checkpoint_at_end: bool = True) -> None:
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
            raise ValueError("RayTrainReportCallback.frequency is %r; want 0 (no periodic checkpoints) or a number of rounds" % (frequency,))
        if not isinstance(filename, str) or not filename or os.sep in filename:
            raise ValueError("RayTrainReportCallback.filename is %r; want a file name, such as %r" % (filename, self.CHECKPOINT_NAME))
        if isinstance(metrics, str):
            metrics = [metrics]
        self._metrics = metrics
        self._filename, self._frequency, self._at_end = filename, frequency, checkpoint_at_end
        self._dir: Optional[str] = None
        self._last: Dict[str, float] = {}
        self._base = 0

    @classmethod
    def get_model(cls, checkpoint: Any, filename: str = CHECKPOINT_NAME) -> xgboost.Booster:
        """The booster in a checkpoint this callback wrote."""
        booster = xgboost.Booster()
        with checkpoint.as_directory() as d:
            path = os.path.join(d, filename)
            if not os.path.exists(path):
                raise ValueError("RayTrainReportCallback.get_model: %s has no %s; its files are %s" % (checkpoint, filename, sorted(os.listdir(d))))
            booster.load_model(path)
        return booster

    def _flatten(self, evals_log: Dict[str, Dict[str, List[Any]]]) -> Dict[str, float]:
        out: Dict[str, float] = {}
        for data, metrics in evals_log.items():
            for name, values in metrics.items():
                v = values[-1]
                out["%s-%s" % (data, name)] = float(v[0] if isinstance(v, tuple) else v)
        if self._metrics is None:
            return out
        if isinstance(self._metrics, dict):
            return {k: out[v] for k, v in self._metrics.items() if v in out}
        return {k: out[k] for k in self._metrics if k in out}

    def _save(self, model: xgboost.Booster) -> str:
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="xgboost-", dir=_dt.scratch_dir())
        shutil.rmtree(self._dir, ignore_errors=True)
        os.makedirs(self._dir)
        if _dt.world_rank() == 0:  # every rank holds the same model; rank 0's is the run's
            model.save_model(os.path.join(self._dir, self._filename))
        return self._dir

    def before_training(self, model: xgboost.Booster) -> xgboost.Booster:
        if _session.active and _dt._epoch is not None:
            # The iteration's steps are the rounds boosted in it: a booster
            # given to start from (xgb_model) holds those already done.
            done = model.num_boosted_rounds()
            self._base = done - _dt._start
            if self._base < 0:
                raise SystemExit("durabletrain.train.xgboost: xgboost.train starts after %d boosted rounds, but the run resumes at "
                                 "round %d: pass xgb_model=RayTrainReportCallback.get_model(train.get_checkpoint()) and "
                                 "num_boost_round less the rounds it has" % (done, _dt._start))
            _dt._in_steps = True
        return model

    def after_iteration(self, model: xgboost.Booster, epoch: int, evals_log: Dict[str, Any]) -> bool:
        self._last = self._flatten(evals_log)
        if not _session.active or _dt._epoch is None:
            return False
        from durabletrain import train
        _dt._step = model.num_boosted_rounds() - self._base  # rounds boosted in this iteration (epoch counts from xgb_model's)
        if self._frequency and _dt._step % self._frequency == 0:
            train.report(dict(self._last), checkpoint=train.Checkpoint.from_directory(self._save(model)))
        elif self._last and _dt._channel() is not None:
            _dt.report(dict(self._last))
        if _dt._sync and _dt._step >= _dt._sync and _dt._sock is not None:
            _dt._synchronise(lambda: self._save(model))
        return False

    def after_training(self, model: xgboost.Booster) -> xgboost.Booster:
        if not _session.active or _dt._epoch is None:
            return model
        from durabletrain import train
        _dt._in_steps = False
        metrics = dict(self._last, rounds=float(model.num_boosted_rounds()))
        if self._at_end:
            train.report(metrics, checkpoint=train.Checkpoint.from_directory(self._save(model)))
        else:
            train.report(metrics)
        return model
