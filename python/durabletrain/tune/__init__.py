"""Ray Tune's API over durabletrain's TuneWorkflow (``ray.tune`` → ``durabletrain.tune``).

Each trial is a child TrainingWorkflow; the search survives its driver
(fit() again with the same RunConfig name attaches to it). The search
space, schedulers and searchers are the Go side's: this module only
spells them as Ray does.

Example:
    >>> from durabletrain import tune
    >>> space = {"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1), "width": tune.choice([64, 128])}}
    >>> tune.TuneConfig(metric="acc", mode="max", num_samples=4).num_samples
    4
"""

from __future__ import annotations

import numbers
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from durabletrain._configs import RunConfig

__all__ = ["Tuner", "run", "Trainable", "ExperimentAnalysis", "CLIReporter", "TuneConfig", "ResultGrid", "ASHAScheduler", "MedianStoppingRule", "PopulationBasedTraining", "FIFOScheduler",
           "TPESearch", "choice", "grid_search", "uniform", "loguniform", "randint"]

WORKFLOW_TUNE = "TuneWorkflow"


class Domain(dict):
    """A search-space entry, as the Go side's param_space spells it."""


def grid_search(values: List[Any]) -> Domain:
    return Domain(grid_search=list(values))


def choice(categories: List[Any]) -> Domain:
    return Domain(choice=list(categories))


def uniform(lower: float, upper: float) -> Domain:
    return Domain(uniform=[lower, upper])


def loguniform(lower: float, upper: float) -> Domain:
    return Domain(loguniform=[lower, upper])


def randint(lower: int, upper: int) -> Domain:
    return Domain(randint=[lower, upper])


def _unsupported(name: str) -> Any:
    def f(*args: Any, **kwargs: Any) -> Domain:
        raise ValueError("tune.%s is not a search space durabletrain has; want one of tune.choice, tune.grid_search, "
                         "tune.uniform, tune.loguniform, tune.randint" % name)
    f.__name__ = name
    return f


quniform = _unsupported("quniform")
qloguniform = _unsupported("qloguniform")
randn = _unsupported("randn")
qrandn = _unsupported("qrandn")
qrandint = _unsupported("qrandint")
lograndint = _unsupported("lograndint")
sample_from = _unsupported("sample_from")


def report(metrics: Dict[str, Any], *, checkpoint: Any = None) -> None:
    """Ray Tune's tune.report: durabletrain.train.report."""
    from durabletrain import train
    train.report(metrics, checkpoint=checkpoint)


def get_checkpoint() -> Any:
    from durabletrain import train
    return train.get_checkpoint()


def with_parameters(trainable: Any, **kwargs: Any) -> Any:
    """Ray Tune's with_parameters: the objects travel with the function (pickled by value)."""
    import functools
    import inspect
    if isinstance(trainable, type):
        raise TypeError("tune.with_parameters: a Trainable class is not supported; pass a function")
    f = functools.partial(trainable, **kwargs)
    f.__signature__ = inspect.Signature([p for p in inspect.signature(trainable).parameters.values() if p.name not in kwargs])  # type: ignore[attr-defined]
    return f


def with_resources(trainable: Any, resources: Any) -> Any:
    """Ray Tune's with_resources: a trial's slots are the pool's; accepted as it is."""
    return trainable


@dataclass
class FIFOScheduler:
    def to_spec(self) -> Dict[str, Any]:
        return {"type": "fifo"}


def _check_time_attr(owner: str, time_attr: str) -> None:
    if time_attr != "training_iteration":
        raise ValueError("%s: time_attr is %r; want \"training_iteration\" (a durable search counts a trial's reports, "
                         "not its seconds, so that a trial resumed after a failure is judged where it was)" % (owner, time_attr))


def _check_mode(owner: str, mode: Optional[str]) -> None:
    if mode not in (None, "max", "min"):
        raise ValueError("%s: mode is %r; want \"max\" or \"min\"" % (owner, mode))


@dataclass
class ASHAScheduler:
    """Asynchronous successive halving (Ray Tune's ASHAScheduler, with its
    arguments): rungs at grace_period * reduction_factor**k below max_t.

    Example:
        >>> ASHAScheduler(metric="loss", mode="min", max_t=16, grace_period=1).to_spec()["max_t"]
        16
    """

    time_attr: str = "training_iteration"
    metric: Optional[str] = None
    mode: Optional[str] = None
    max_t: int = 100
    grace_period: int = 1
    reduction_factor: float = 4
    brackets: int = 1
    stop_last_trials: bool = True

    def __post_init__(self) -> None:
        _check_time_attr("ASHAScheduler", self.time_attr)
        _check_mode("ASHAScheduler", self.mode)
        if self.brackets != 1:
            raise ValueError("ASHAScheduler: brackets is %r; want 1 (Ray's default: one bracket of rungs)" % (self.brackets,))
        if self.stop_last_trials is not True:
            raise ValueError("ASHAScheduler: stop_last_trials is %r; want True (a trial stops at max_t)" % (self.stop_last_trials,))

    def to_spec(self) -> Dict[str, Any]:
        return {"type": "asha", "max_t": self.max_t, "grace_period": self.grace_period, "reduction_factor": self.reduction_factor}


AsyncHyperBandScheduler = ASHAScheduler  # Ray's other name for it


@dataclass
class MedianStoppingRule:
    """Stops a trial whose best result is below the median of the others'
    running means at the same iteration (Ray Tune's MedianStoppingRule;
    its grace_period counts iterations here, as time_attr does)."""

    time_attr: str = "training_iteration"
    metric: Optional[str] = None
    mode: Optional[str] = None
    grace_period: int = 1
    min_samples_required: int = 3
    min_time_slice: int = 0
    hard_stop: bool = True

    def __post_init__(self) -> None:
        _check_time_attr("MedianStoppingRule", self.time_attr)
        _check_mode("MedianStoppingRule", self.mode)
        if self.hard_stop is not True:
            raise ValueError("MedianStoppingRule: hard_stop is %r; want True (a trial it stops ends; none is paused)" % (self.hard_stop,))

    def to_spec(self) -> Dict[str, Any]:
        return {"type": "median", "grace_period": self.grace_period, "min_samples_required": self.min_samples_required}


@dataclass
class PopulationBasedTraining:
    """Population based training (Ray Tune's PopulationBasedTraining, with
    its arguments): every perturbation_interval iterations a trial in the
    bottom quantile_fraction takes the checkpoint and config of one in the
    top, and explores: each of hyperparam_mutations' values resampled with
    resample_probability, else multiplied by 1.2 or 0.8 (a number) or moved
    to a neighbouring value (a list).

    Example:
        >>> pbt = PopulationBasedTraining(time_attr="training_iteration", metric="mean_accuracy", mode="max",
        ...                               perturbation_interval=4, hyperparam_mutations={"lr": uniform(1e-4, 0.1)})
        >>> pbt.to_spec()["perturbation_interval"]
        4
    """

    time_attr: str = "training_iteration"
    metric: Optional[str] = None
    mode: Optional[str] = None
    perturbation_interval: int = 1
    burn_in_period: int = 0
    hyperparam_mutations: Dict[str, Any] = field(default_factory=dict)
    quantile_fraction: float = 0.25
    resample_probability: float = 0.25
    perturbation_factors: Any = (1.2, 0.8)
    custom_explore_fn: Any = None
    log_config: bool = True
    require_attrs: bool = True
    synch: bool = False

    def __post_init__(self) -> None:
        _check_time_attr("PopulationBasedTraining", self.time_attr)
        _check_mode("PopulationBasedTraining", self.mode)
        if isinstance(self.perturbation_interval, bool) or not isinstance(self.perturbation_interval, numbers.Integral) \
                or self.perturbation_interval < 1:
            raise ValueError("PopulationBasedTraining: perturbation_interval is %r; want a whole number of iterations, 1 or more"
                             % (self.perturbation_interval,))
        if self.burn_in_period not in (0, 0.0):
            raise ValueError("PopulationBasedTraining: burn_in_period is %r; want 0 (a trial may be perturbed from its first "
                             "perturbation_interval on)" % (self.burn_in_period,))
        if tuple(self.perturbation_factors) != (1.2, 0.8):
            raise ValueError("PopulationBasedTraining: perturbation_factors is %r; want (1.2, 0.8), Ray's default (the search "
                             "explores by those)" % (self.perturbation_factors,))
        if self.custom_explore_fn is not None:
            raise ValueError("PopulationBasedTraining: custom_explore_fn is given; a durable search decides in its workflow, "
                             "which runs no function of the driver: express the explore as hyperparam_mutations")
        if self.synch:
            raise ValueError("PopulationBasedTraining: synch=True; want False (each trial is perturbed as it reaches its "
                             "interval, Ray's default)")
        if not isinstance(self.hyperparam_mutations, dict):
            raise TypeError("PopulationBasedTraining: hyperparam_mutations is %r; want a dict of config keys to search-space "
                            "entries or lists" % (self.hyperparam_mutations,))

        for k, v in _flatten(self.hyperparam_mutations).items():
            if not isinstance(v, (Domain, list, tuple)):
                raise ValueError("PopulationBasedTraining: hyperparam_mutations[%r] is %r; want a search-space entry "
                                 "(tune.uniform, tune.loguniform, tune.choice, tune.randint) or a list of values (a function "
                                 "would run in the driver, which a durable search does not need)" % (k, v))

    def to_spec(self) -> Dict[str, Any]:
        return {"type": "pbt", "perturbation_interval": self.perturbation_interval, "quantile_fraction": self.quantile_fraction,
                "resample_probability": self.resample_probability,
                "hyperparam_mutations": {_key(k): v if isinstance(v, Domain) else choice(list(v))  # Ray: a list is a choice
                                         for k, v in _flatten(self.hyperparam_mutations).items()}}


@dataclass
class TPESearch:
    """Tree-structured Parzen estimators (Optuna's TPE, as OptunaSearch runs it)."""

    n_startup_trials: int = 10

    def to_spec(self) -> Dict[str, Any]:
        return {"type": "tpe", "n_startup_trials": self.n_startup_trials}


@dataclass
class TuneConfig:
    """How a search runs (Ray Tune's TuneConfig)."""

    metric: Optional[str] = None
    mode: Optional[str] = None
    num_samples: int = 1
    max_concurrent_trials: Optional[int] = None
    scheduler: Any = None
    search_alg: Any = None
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        if self.mode not in (None, "max", "min"):
            raise ValueError("TuneConfig.mode is %r; want \"max\" or \"min\"" % (self.mode,))
        if isinstance(self.num_samples, bool) or not isinstance(self.num_samples, numbers.Integral) or self.num_samples < 1:
            raise ValueError("TuneConfig.num_samples is %r; want a whole number of at least 1" % (self.num_samples,))
        if self.max_concurrent_trials is not None and (isinstance(self.max_concurrent_trials, bool) or
                                                       not isinstance(self.max_concurrent_trials, numbers.Integral) or self.max_concurrent_trials < 1):
            raise ValueError("TuneConfig.max_concurrent_trials is %r; want a whole number of at least 1" % (self.max_concurrent_trials,))
        for name in ("scheduler", "search_alg"):
            v = getattr(self, name)
            if v is not None and not hasattr(v, "to_spec"):
                raise TypeError("TuneConfig.%s is %r; want one of durabletrain.tune's (ASHAScheduler, PopulationBasedTraining, TPESearch, "
                                "durabletrain.tune.search.optuna.OptunaSearch, ...)" % (name, v))


def _flatten(space: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in space.items():
        if isinstance(v, dict) and not isinstance(v, Domain):
            out.update(_flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def _key(k: str) -> str:
    """A trainer's param_space key as the Go side's: train_loop_config.lr -> config.lr."""
    if k.startswith("train_loop_config."):
        return "config." + k[len("train_loop_config."):]
    return "config." + k if not k.startswith("config.") else k


@dataclass
class TrialResult:
    config: Dict[str, Any]
    metrics: Dict[str, Any]
    status: str
    checkpoint: Any
    workflow_id: str
    reason: str = ""
    iterations: int = 0


class ResultGrid:
    """A search's trials (Ray Tune's ResultGrid)."""

    def __init__(self, raw: Dict[str, Any], metric: str, mode: str) -> None:
        from durabletrain.train import Checkpoint
        self.raw, self.metric, self.mode = raw, metric, mode
        self.results: List[TrialResult] = []
        for t in raw.get("trials") or []:
            ref = t.get("checkpoint")
            ck = Checkpoint(url=ref["url"], run=ref["run"], id=ref["id"], epoch=ref.get("epoch", 0), step=ref.get("step", 0)) if ref else None
            metrics = dict(t.get("metrics") or {})
            if t.get("last") is not None:
                metrics.setdefault(metric, t["last"])
            metrics["training_iteration"] = t.get("epochs", 0)
            config = {k[len("config."):] if k.startswith("config.") else k: v for k, v in (t.get("config") or {}).items()}
            self.results.append(TrialResult(config=config, metrics=metrics, status=t.get("status", ""), checkpoint=ck,
                                            workflow_id=t.get("workflow_id", ""), reason=t.get("reason", ""), iterations=t.get("epochs", 0)))

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i: int) -> TrialResult:
        return self.results[i]

    @property
    def errors(self) -> List[str]:
        return [r.reason for r in self.results if r.status == "failed"]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for r in self.results if r.status in ("completed", "early-stopped"))

    def get_best_result(self, metric: Optional[str] = None, mode: Optional[str] = None, scope: str = "last") -> TrialResult:
        metric, mode = metric or self.metric, mode or self.mode
        if scope not in ("last", "all"):
            raise ValueError("ResultGrid.get_best_result: scope is %r; want \"last\" or \"all\"" % (scope,))
        scored = [r for r in self.results if isinstance(r.metrics.get(metric), (int, float))]
        if not scored:
            raise RuntimeError("no trial reported %r" % metric)
        pick = max if mode == "max" else min
        return pick(scored, key=lambda r: r.metrics[metric])

    def get_dataframe(self) -> Any:
        import pandas
        rows = []
        for r in self.results:
            row = {"trial_id": r.workflow_id, "status": r.status}
            row.update({"config/" + k: v for k, v in r.config.items()})
            row.update(r.metrics)
            rows.append(row)
        return pandas.DataFrame(rows)


class Tuner:
    """A hyperparameter search over a trainer (Ray Tune's Tuner).

    param_space holds the trainer's ``train_loop_config`` keys (each trial's
    function receives them in its config), spelled with tune.choice,
    tune.loguniform, ...
    """

    def __init__(self, trainable: Any, *, param_space: Optional[Dict[str, Any]] = None, tune_config: Optional[TuneConfig] = None,
                 run_config: Optional[RunConfig] = None) -> None:
        from durabletrain._driver import Job
        from durabletrain.train.torch import TorchTrainer
        if param_space is not None and not isinstance(param_space, dict):
            raise TypeError("Tuner: param_space is %r; want a dict" % (param_space,))
        if not isinstance(getattr(trainable, "_job", None), Job):  # TorchTrainer, XGBoostTrainer
            if isinstance(trainable, type) and issubclass(trainable, Trainable):
                trainable = TorchTrainer(_run_trainable(trainable))
            elif callable(trainable):
                trainable = TorchTrainer(trainable)
            else:
                raise TypeError("Tuner: trainable is %r; want a TorchTrainer or XGBoostTrainer, a Trainable class or a training "
                                "function" % (trainable,))
            # A function trainable's param_space is its config itself, as in Ray.
            param_space = {"train_loop_config": dict(param_space or {})}
            self._function_trainable = True
        else:
            self._function_trainable = False
        self.trainer = trainable
        self.param_space = param_space or {}
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or trainable._job.run
        self.stop: Dict[str, float] = dict(self.run_config.stop or {})
        job = trainable._job
        self.name = self.run_config.name or job.name.replace(job.owner, "Tuner")
        flat = _flatten(self.param_space)
        self.domains: Dict[str, Domain] = {}
        for k, v in flat.items():
            if not k.startswith("train_loop_config."):
                raise ValueError("Tuner: param_space has %r; want the trainer's config under \"train_loop_config\" "
                                 "(as Ray Tune's trainers take it)" % (k,))
            if isinstance(v, Domain):
                self.domains[k] = v
            elif isinstance(v, dict) or callable(v):
                raise ValueError("Tuner: param_space[%r] is %r; want a search-space entry (tune.choice, tune.uniform, tune.loguniform, "
                                 "tune.randint, tune.grid_search) or a constant" % (k, v))
            else:  # a constant: every trial's function gets it, as Ray's does
                trainable._job.config[k[len("train_loop_config."):]] = v

    def spec(self) -> Dict[str, Any]:
        from durabletrain import _cluster, _driver
        cluster = _cluster.current()
        job = self.trainer._job
        job.name = self.name
        train = job.build_spec(cluster)
        train.pop("name", None)
        # Ray: the Tuner's run_config wins the trainer's, callbacks included;
        # a function trainable's trial config is logged as itself ("lr"), a
        # trainer's under train_loop_config, as Ray's MLflow callback does.
        train.pop("mlflow", None)
        cb = self.run_config.mlflow
        if cb is not None:
            train["mlflow"] = job.mlflow_section(cb, None if self._function_trainable else "train_loop_config")
        tc = self.tune_config
        s: Dict[str, Any] = {"name": self.name, "train": train,
                             "param_space": {_key(k): dict(v) for k, v in self.domains.items()},
                             "num_samples": tc.num_samples}
        metric = tc.metric or getattr(tc.scheduler, "metric", None) or getattr(tc.search_alg, "metric", None)
        mode = tc.mode or getattr(tc.scheduler, "mode", None) or getattr(tc.search_alg, "mode", None)
        if metric:
            s["metric"] = metric
        if mode:
            s["mode"] = mode
        if tc.max_concurrent_trials:
            s["max_concurrent_trials"] = tc.max_concurrent_trials
        elif cluster.local:
            # As Ray does: as many trials at once as the machine's slots hold.
            s["max_concurrent_trials"] = max(1, min(tc.num_samples, max(cluster.slots, 2) // job.scaling.num_workers))
        if tc.scheduler is not None:
            s["scheduler"] = tc.scheduler.to_spec()
        if tc.search_alg is not None:
            s["search_alg"] = tc.search_alg.to_spec()
        seed = tc.seed if tc.seed is not None else getattr(tc.search_alg, "seed", None)
        if seed is not None:
            s["seed"] = seed
        if self.stop:
            s["stop"] = dict(self.stop)
        return s

    @classmethod
    def can_restore(cls, path: str) -> bool:
        """Whether ``path`` (a search's ``storage_path/name``, or its name)
        names a search this cluster holds, running or ended: Ray Tune's
        ``Tuner.can_restore``.

        Example:
            >>> if Tuner.can_restore("~/durabletrain_results/asha"):   # doctest: +SKIP
            ...     grid = Tuner.restore("~/durabletrain_results/asha", trainable=train_fn).fit()
        """
        return _search_of(_search_name("Tuner.can_restore", path)) is not None

    @classmethod
    def restore(cls, path: str, trainable: Any = None, *, resume_unfinished: bool = True, resume_errored: bool = False,
                restart_errored: bool = False, param_space: Optional[Dict[str, Any]] = None, storage_filesystem: Any = None,
                **ignored: Any) -> "Tuner":
        """The search ``path`` names, to ``fit()`` again after its driver
        died (Ray Tune's ``Tuner.restore``). The search itself never
        stopped: it is a workflow, which went on without the driver, so
        ``fit()`` attaches to it, waits for it if it still runs, and
        returns its trials, none of them trained again. ``trainable`` and
        ``param_space`` are taken for Ray's sake (the search holds its
        own). A failed trial was retried within the search
        (``FailureConfig.max_failures``); running it again after the search
        ended (``resume_errored``, ``restart_errored``) is refused.
        """
        name = _search_name("Tuner.restore", path)
        for arg, v in (("resume_errored", resume_errored), ("restart_errored", restart_errored)):
            if v:
                raise ValueError("Tuner.restore: %s=True: durabletrain retries a trial's failures within the search "
                                 "(FailureConfig.max_failures), and a search that has ended runs no trial again; start a new "
                                 "Tuner for the trials that failed" % arg)
        if not resume_unfinished:
            raise ValueError("Tuner.restore: resume_unfinished=False: the search's unfinished trials never stopped (the search "
                             "went on without its driver); leave it True, or stop the search (durabletrain CLI: starter stop)")
        if _search_of(name) is None:
            raise ValueError("Tuner.restore: path %r names the search %r, which this cluster does not hold; want the path of "
                             "a search Tuner.fit started on it (storage_path/name, or the name), on the same cluster "
                             "(durabletrain.init's address)" % (path, name))
        t = cls.__new__(cls)
        t.name = name
        t.run_config = RunConfig(name=name)
        t._restored = True
        return t

    def fit(self) -> ResultGrid:
        from durabletrain import _cluster, _driver
        cluster = _cluster.current()
        if getattr(self, "_restored", False):
            handle = cluster.client().get_workflow_handle(self.name)
            if self.run_config.verbose:
                print("durabletrain: attached to search %s" % self.name, file=sys.stderr, flush=True)
            return self._grid(cluster, handle, None, None)  # the search's result says its metric and mode
        s = self.spec()
        try:
            _driver.check_spec(s, "tune")
        except _driver.SpecError as e:
            raise ValueError("Tuner: the search's spec was refused before it started: %s" % e) from None
        cluster.ensure_slots(self.trainer._job.scaling.num_workers * s.get("max_concurrent_trials", 1))
        handle, attached = _driver.start_or_attach(cluster, self.name, WORKFLOW_TUNE, s)
        if self.run_config.verbose:
            print("durabletrain: %s search %s" % ("attached to" if attached else "started", self.name), file=sys.stderr, flush=True)

        return self._grid(cluster, handle, s.get("metric", "test_accuracy"), s.get("mode", "max"))

    def _grid(self, cluster: Any, handle: Any, metric: str, mode: str) -> ResultGrid:
        async def outcome() -> Any:
            return await handle.result()
        raw = cluster.loop.run(outcome())
        grid = ResultGrid(raw, metric or raw.get("metric") or "test_accuracy", mode or raw.get("mode") or "max")
        if self.run_config.verbose:
            for r in grid.results:
                print("durabletrain: trial %s %s %s %s" % (r.workflow_id, r.status, r.config, r.metrics), file=sys.stderr)
        return grid


def _search_name(owner: str, path: Any) -> str:
    """A search's name from Ray's experiment path (storage_path/name, a
    URI, or the name alone): its last part."""
    if not isinstance(path, str) or not path.strip("/"):
        raise ValueError("%s: path is %r; want a search's path (storage_path/name) or its name" % (owner, path))
    return path.rstrip("/").rsplit("/", 1)[-1]


def _search_of(name: str) -> Optional[Any]:
    """The status of the search workflow named name on the current
    cluster, or None if it holds none."""
    from temporalio.service import RPCError, RPCStatusCode
    from durabletrain import _cluster
    cluster = _cluster.current()
    h = cluster.client().get_workflow_handle(name)

    async def go() -> Any:
        try:
            d = await h.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        if d.workflow_type != WORKFLOW_TUNE:
            return None
        return d.status
    return cluster.loop.run(go())


class Trainable:
    """Ray Tune's class API: subclass it with setup(config), step() (returns
    the iteration's metrics), save_checkpoint(checkpoint_dir) and
    load_checkpoint(checkpoint); tune.run runs it, one process per trial,
    with a checkpoint after every step (so a trial lost costs at most one)."""

    def __init__(self, config: Optional[Dict[str, Any]] = None) -> None:
        self.config = dict(config or {})
        self.iteration = 0
        self.setup(self.config)

    def setup(self, config: Dict[str, Any]) -> None:
        pass

    def step(self) -> Dict[str, Any]:
        raise NotImplementedError("Trainable.step: return the iteration's metrics, as a dict")

    def save_checkpoint(self, checkpoint_dir: str) -> Any:
        return None

    def load_checkpoint(self, checkpoint: Any) -> None:
        pass


def _run_trainable(cls: Any) -> Any:
    def trainable_loop(config: Dict[str, Any]) -> None:
        import json
        import os
        import tempfile
        from durabletrain import train
        t = cls(config)
        ck = train.get_checkpoint()
        if ck is not None:
            meta = json.load(open(os.path.join(ck.path, ".durabletrain_trainable.json")))
            t.iteration = meta["iteration"]
            t.load_checkpoint(os.path.join(ck.path, meta["returned"]) if meta["returned"] is not None else ck.path)
        while True:
            metrics = t.step()
            if not isinstance(metrics, dict):
                raise TypeError("%s.step returned %r; want a dict of metrics" % (cls.__name__, metrics))
            t.iteration += 1
            with tempfile.TemporaryDirectory() as d:
                returned = t.save_checkpoint(d)
                rel = None
                if isinstance(returned, str) and returned:
                    rel = os.path.relpath(os.path.abspath(returned), d)
                    if rel == ".":
                        rel = None
                with open(os.path.join(d, ".durabletrain_trainable.json"), "w") as f:
                    json.dump({"iteration": t.iteration, "returned": rel}, f)
                train.report(metrics, checkpoint=train.Checkpoint.from_directory(d))
            if metrics.get("done"):
                return
    trainable_loop.__name__ = getattr(cls, "__name__", "trainable")
    return trainable_loop


class ExperimentAnalysis:
    """What tune.run returns (Ray Tune's ExperimentAnalysis)."""

    def __init__(self, grid: ResultGrid) -> None:
        self.grid = grid
        self.trials = grid.results

    @property
    def results_df(self) -> Any:
        return self.grid.get_dataframe()

    def dataframe(self, metric: Optional[str] = None, mode: Optional[str] = None) -> Any:
        return self.grid.get_dataframe()

    def get_best_config(self, metric: Optional[str] = None, mode: Optional[str] = None, scope: str = "last") -> Dict[str, Any]:
        return self.grid.get_best_result(metric, mode, scope).config

    @property
    def best_config(self) -> Dict[str, Any]:
        return self.get_best_config()

    @property
    def best_result(self) -> Dict[str, Any]:
        return self.grid.get_best_result().metrics


class CLIReporter:
    """Accepted for Ray's sake: fit() draws its own progress."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


# Ray's tune.run arguments that change nothing in a durable search.
_RUN_ARGS_TAKEN = frozenset(("resume", "checkpoint_freq", "checkpoint_at_end", "keep_checkpoints_num", "checkpoint_score_attr",
                             "log_to_file", "reuse_actors", "sync_config", "trial_name_creator", "trial_dirname_creator",
                             "chdir_to_trial_dir", "raise_on_failed_trial", "server_port", "export_formats", "storage_filesystem",
                             "checkpoint_config", "loggers"))
# Ones that would change it and cannot be honoured, with why.
_RUN_ARGS_REFUSED = {
    "fail_fast": "durabletrain lets the other trials finish when one fails (it is retried as FailureConfig.max_failures says); "
                 "leave it out",
    "time_budget_s": "a search's budget is its trials and their stop criteria; leave it out and bound stop={\"training_iteration\": N}",
    "restore": "a trial starts from its own config; resume a search by its name (Tuner.restore)",
    "scheduler_options": "leave it out",
}


def run(run_or_experiment: Any, *, config: Optional[Dict[str, Any]] = None, num_samples: int = 1, scheduler: Any = None,
        search_alg: Any = None, stop: Optional[Dict[str, Any]] = None, resources_per_trial: Optional[Dict[str, Any]] = None,
        metric: Optional[str] = None, mode: Optional[str] = None, name: Optional[str] = None, storage_path: Optional[str] = None,
        max_concurrent_trials: Optional[int] = None, progress_reporter: Any = None, verbose: int = 1,
        callbacks: Optional[List[Any]] = None, local_dir: Optional[str] = None, max_failures: Optional[int] = None,
        **others: Any) -> ExperimentAnalysis:
    """Ray Tune's tune.run over a Trainable class or a function trainable.

    Ray's arguments that change nothing here are taken (``resume``: a
    search of the same name is attached to anyway; ``checkpoint_freq``: a
    Trainable checkpoints every step; the log, sync and naming ones);
    ``local_dir`` is ``storage_path``'s old name; ``max_failures`` is each
    trial's (default FailureConfig's 3, where Ray's is 0); one that would change the
    search and cannot be honoured (``fail_fast``, ``time_budget_s``) is
    refused, and an unknown one too, by name.
    """
    from durabletrain.train import FailureConfig, RunConfig, ScalingConfig
    from durabletrain.train.torch import TorchTrainer
    for k, v in others.items():
        if k in _RUN_ARGS_TAKEN:
            continue
        if k in _RUN_ARGS_REFUSED:
            if v in (None, False, 0):
                continue
            raise ValueError("tune.run: %s=%r: %s" % (k, v, _RUN_ARGS_REFUSED[k]))
        raise TypeError("tune.run: got the argument %r, which neither Ray Tune's tune.run nor durabletrain's takes; want "
                        "config, num_samples, scheduler, search_alg, stop, resources_per_trial, metric, mode, name, "
                        "storage_path, max_concurrent_trials, max_failures, callbacks, verbose" % (k,))
    if local_dir is not None:
        if storage_path is not None and storage_path != local_dir:
            raise ValueError("tune.run: local_dir %r and storage_path %r; want one (local_dir is its old name)" % (local_dir, storage_path))
        storage_path = local_dir
    fn = run_or_experiment
    if isinstance(fn, type) and issubclass(fn, Trainable):
        fn = _run_trainable(fn)
    elif not callable(fn):
        raise TypeError("tune.run: run_or_experiment is %r; want a Trainable subclass or a function" % (fn,))
    res = dict(resources_per_trial or {})
    for k in res:
        if k not in ("cpu", "gpu", "CPU", "GPU"):
            raise ValueError("tune.run: resources_per_trial has %r; want \"cpu\" and \"gpu\"" % (k,))
    gpus = int(res.get("gpu", res.get("GPU", 0)) or 0)
    scaling = ScalingConfig(num_workers=1, use_gpu=gpus > 0, resources_per_worker={"GPU": gpus} if gpus > 1 else None)
    stop = dict(stop or {})
    iterations = stop.get("training_iteration")
    rc = RunConfig(name=name, storage_path=storage_path, verbose=verbose, callbacks=callbacks,
                   failure_config=FailureConfig() if max_failures is None else FailureConfig(max_failures=max_failures),
                   stop={"training_iteration": int(iterations)} if iterations is not None else None)
    tuner = Tuner(TorchTrainer(fn, scaling_config=scaling, run_config=rc), param_space={"train_loop_config": dict(config or {})},
                  tune_config=TuneConfig(metric=metric, mode=mode, num_samples=num_samples, scheduler=scheduler, search_alg=search_alg,
                                         max_concurrent_trials=max_concurrent_trials),
                  run_config=rc)
    tuner.stop = {k: float(v) for k, v in stop.items()}
    tuner._function_trainable = True  # its trials' params are logged as the config's own keys, as Ray's are
    return ExperimentAnalysis(tuner.fit())
