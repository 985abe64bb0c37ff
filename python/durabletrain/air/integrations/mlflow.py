"""Ray's MLflowLoggerCallback, carried out by the run's workflow.

In Ray the callback runs in the driver and logs as results arrive; a
durable run outlives its driver, so here the callback is a description the
run's spec carries (its ``mlflow`` section), and the workflows' workers log
each report to the MLflow tracking server: the params (the trial's config,
flattened with "/": ``train_loop_config/lr``), every metric at its
``training_iteration`` as the step, the latest checkpoint's URL (the tag
``durabletrain.checkpoint``), and the status (FINISHED, FAILED or KILLED).
Each trial of a search is a run of its own, tagged ``trial_name`` and
``durabletrain.search``. A server that is down never fails the run: the
reports are kept and logged when it answers.

The workers must be allowed to reach the server (the worker's
``-trackers`` flag; a local cluster's workers allow any) and hold its
credentials (MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and
MLFLOW_TRACKING_PASSWORD, in their environment): the spec travels in the
run's history in the clear, so it holds no secret.

Example:
    >>> from durabletrain.air.integrations.mlflow import MLflowLoggerCallback
    >>> cb = MLflowLoggerCallback("http://127.0.0.1:5000", experiment_name="fashion", tags={"team": "vision"})
    >>> cb.to_spec()["experiment_name"]
    'fashion'
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional

__all__ = ["MLflowLoggerCallback", "Callback"]


class Callback:
    """Ray Tune's Callback: a hook of the driver. durabletrain's runs take
    only the callbacks it carries out itself (MLflowLoggerCallback): a
    callback of your own would run in a driver the run outlives."""

    def to_spec(self) -> Dict[str, Any]:
        raise NotImplementedError


def _tracking_field(name: str) -> str:
    return "MLflowLoggerCallback(%s)" % name


class MLflowLoggerCallback(Callback):
    """Log a run, or each trial of a search, to an MLflow tracking server
    (Ray's ``ray.air.integrations.mlflow.MLflowLoggerCallback``).

    ``tracking_uri`` is the server's http(s) URL; None: the environment's
    MLFLOW_TRACKING_URI. ``experiment_name`` (default MLflow's "Default")
    is created if missing. ``tags`` are set on every run. Arguments Ray has
    that cannot be honoured durably are refused, saying why:
    ``registry_uri`` (nothing is registered), ``tracking_token`` (it would
    travel in the run's history: give the workers MLFLOW_TRACKING_TOKEN),
    and ``save_artifact=True`` (the checkpoints stay in the run's storage;
    their URL is the run's ``durabletrain.checkpoint`` tag).

    Example:
        >>> MLflowLoggerCallback("http://mlflow.internal:5000", log_params_on_trial_end=True).to_spec()
        {'tracking_uri': 'http://mlflow.internal:5000', 'log_params_on_trial_end': True}
    """

    def __init__(self, tracking_uri: Optional[str] = None, *, registry_uri: Optional[str] = None,
                 experiment_name: Optional[str] = None, tags: Optional[Mapping[str, Any]] = None,
                 tracking_token: Optional[str] = None, save_artifact: bool = False,
                 log_params_on_trial_end: bool = False) -> None:
        if tracking_uri is None:
            tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or None
            if tracking_uri is None:
                raise ValueError("%s is not given and MLFLOW_TRACKING_URI is not set; want the http:// or https:// URL of an "
                                 "MLflow tracking server (`mlflow server`), such as http://127.0.0.1:5000" % _tracking_field("tracking_uri"))
        if not isinstance(tracking_uri, str):
            raise TypeError("%s is %r; want the http:// or https:// URL of an MLflow tracking server" % (_tracking_field("tracking_uri"), tracking_uri))
        if tracking_uri.startswith(("file:", "/", ".", "sqlite:", "databricks")) or "://" not in tracking_uri:
            raise ValueError("%s is %r: the run is logged by the workflows' workers, which a local store (mlruns/, sqlite, "
                             "databricks) does not reach; start `mlflow server` and give its http:// URL" % (_tracking_field("tracking_uri"), tracking_uri))
        if registry_uri is not None:
            raise ValueError("%s is %r; durabletrain registers no model: leave it out (the checkpoint's URL is the run's "
                             "durabletrain.checkpoint tag)" % (_tracking_field("registry_uri"), registry_uri))
        if tracking_token is not None:
            raise ValueError("%s is given; a token in the callback would travel in the run's history in the clear: set "
                             "MLFLOW_TRACKING_TOKEN in the workflows' workers' environment (a local cluster's workers inherit the "
                             "driver's)" % _tracking_field("tracking_token"))
        if not isinstance(save_artifact, bool):
            raise TypeError("%s is %r; want True or False" % (_tracking_field("save_artifact"), save_artifact))
        if save_artifact:
            raise ValueError("%s=True: the checkpoints stay in the run's storage, durably, and are not copied to MLflow; the "
                             "latest one's URL is the MLflow run's durabletrain.checkpoint tag: leave save_artifact False"
                             % _tracking_field("save_artifact"))
        if not isinstance(log_params_on_trial_end, bool):
            raise TypeError("%s is %r; want True or False" % (_tracking_field("log_params_on_trial_end"), log_params_on_trial_end))
        if experiment_name is not None and (not isinstance(experiment_name, str) or not experiment_name):
            raise TypeError("%s is %r; want the name of an experiment (created if missing), or None for MLflow's \"Default\""
                            % (_tracking_field("experiment_name"), experiment_name))
        if experiment_name is None:
            experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or None
        if tags is not None and not isinstance(tags, Mapping):
            raise TypeError("%s is %r; want a dict of tag names to values" % (_tracking_field("tags"), tags))
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.tags: Dict[str, str] = {}
        for k, v in (tags or {}).items():
            if not isinstance(k, str):
                raise TypeError("%s has the key %r; want tag names that are strings" % (_tracking_field("tags"), k))
            self.tags[k] = v if isinstance(v, str) else str(v)  # MLflow's tags are strings (Ray's str()s them)
        self.log_params_on_trial_end = log_params_on_trial_end
        self._check()

    def to_spec(self) -> Dict[str, Any]:
        """The run's ``mlflow`` section (docs/spec.md)."""
        out: Dict[str, Any] = {"tracking_uri": self.tracking_uri}
        if self.experiment_name:
            out["experiment_name"] = self.experiment_name
        if self.tags:
            out["tags"] = dict(self.tags)
        if self.log_params_on_trial_end:
            out["log_params_on_trial_end"] = True
        return out

    def _check(self) -> None:
        """The Go side's own check of the section, before anything starts."""
        from durabletrain import _driver
        try:
            _driver.check_spec({"trainer": "exec", "exec": {"command": ["python"]}, "mlflow": self.to_spec()})
        except _driver.SpecError as e:
            raise ValueError("MLflowLoggerCallback: %s" % e) from None

    def __repr__(self) -> str:
        return "MLflowLoggerCallback(%r, experiment_name=%r, tags=%r)" % (self.tracking_uri, self.experiment_name, self.tags)
