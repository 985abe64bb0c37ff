"""Ray Tune's ``OptunaSearch`` (``ray.tune.search.optuna``), over the search
workflow's TPE: Optuna's tree-structured Parzen estimators, with Optuna's
defaults (10 random startup trials, then TPE).

Example:
    >>> from durabletrain.tune.search.optuna import OptunaSearch
    >>> OptunaSearch(metric="accuracy", mode="max", seed=3).to_spec()
    {'type': 'tpe', 'n_startup_trials': 10}
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional

__all__ = ["OptunaSearch"]


class OptunaSearch:
    """Optuna's TPE as Ray Tune's searcher: ``metric``, ``mode`` and ``seed``
    as Ray takes them (the Tuner's TuneConfig wins where both say), and
    ``sampler`` None or an ``optuna.samplers.TPESampler`` (its
    ``n_startup_trials`` is kept). The search space comes from the Tuner's
    ``param_space``; an Optuna space of its own (``space=``), points to
    evaluate first and other samplers are refused, naming the argument.
    """

    def __init__(self, space: Optional[Any] = None, metric: Optional[str] = None, mode: Optional[str] = None,
                 points_to_evaluate: Optional[List[Dict[str, Any]]] = None, sampler: Optional[Any] = None,
                 seed: Optional[int] = None, evaluated_rewards: Optional[List[Any]] = None, **kwargs: Any) -> None:
        if space is not None:
            raise ValueError("OptunaSearch: space is %r; want None: give the search space as the Tuner's param_space "
                             "(tune.uniform, tune.loguniform, tune.choice, tune.randint)" % (space,))
        if points_to_evaluate or evaluated_rewards:
            raise ValueError("OptunaSearch: points_to_evaluate and evaluated_rewards are not supported; want None "
                             "(the search starts with Optuna's random startup trials)")
        if kwargs:
            raise ValueError("OptunaSearch: unknown argument(s) %s; want space, metric, mode, points_to_evaluate, sampler, seed"
                             % ", ".join(sorted(kwargs)))
        if mode not in (None, "max", "min"):
            raise ValueError("OptunaSearch: mode is %r; want \"max\" or \"min\"" % (mode,))
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError("OptunaSearch: seed is %r; want a whole number of 0 or more" % (seed,))
        self.n_startup_trials = 10
        if sampler is not None:
            if type(sampler).__name__ != "TPESampler":
                raise ValueError("OptunaSearch: sampler is %r; want None or optuna.samplers.TPESampler (the search "
                                 "workflow runs TPE itself)" % (sampler,))
            self.n_startup_trials = int(getattr(sampler, "_n_startup_trials", 10))
            if seed is None:
                rng = getattr(sampler, "_rng", None)
                seed = getattr(rng, "seed", None) if rng is not None and isinstance(getattr(rng, "seed", None), int) else None
        self.metric, self.mode, self.seed = metric, mode, seed

    def to_spec(self) -> Dict[str, Any]:
        return {"type": "tpe", "n_startup_trials": self.n_startup_trials}
