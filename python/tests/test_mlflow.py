"""Ray's MLflowLoggerCallback over durabletrain, against a real `mlflow
server` (the project's virtual environment's) read back with MLflow's own
client: a trainer's run and each trial of a search are MLflow runs with the
params, every reported metric at its training_iteration, the checkpoint's
URL and the status Ray's callback would give them. The callback's arguments
that cannot be honoured durably are refused before anything starts."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("torch")
mlflow = pytest.importorskip("mlflow")

from durabletrain import train, tune  # noqa: E402
from durabletrain.air.integrations.mlflow import MLflowLoggerCallback  # noqa: E402
from durabletrain.train import RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.torch import TorchTrainer  # noqa: E402

from test_fit import linear_loop  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real tracking server on a sqlite store of its own (as the Go
    testkit/mlflowserver starts it)."""
    d = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    url = "http://127.0.0.1:%d" % port
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    exe = os.path.join(os.path.dirname(sys.executable), "mlflow")
    log = open(os.path.join(str(d), "server.log"), "wb")
    p = subprocess.Popen([exe, "server", "--backend-store-uri", "sqlite:///%s" % os.path.join(str(d), "mlflow.db"),
                          "--default-artifact-root", os.path.join(str(d), "artifacts"), "--host", "127.0.0.1",
                          "--port", str(port), "--workers", "1"], cwd=str(d), env=env, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        try:
            if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                break
        except OSError:
            pass
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise RuntimeError("mlflow server did not start: %s" % open(os.path.join(str(d), "server.log")).read()[-2000:])
        time.sleep(0.3)
    yield url
    os.killpg(p.pid, 15)
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
    log.close()


def runs_tagged(url, experiment, key, value):
    client = mlflow.MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, "no experiment %r on the server" % experiment
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`%s` = '%s'" % (key, value), max_results=100)
    return client, runs


def check_metrics(client, run, history):
    """Each reported metric is in MLflow once per iteration that reported
    it, at training_iteration as its step, with the reported value."""
    keys = {k for row in history for k in row if isinstance(row[k], (int, float)) and k != "training_iteration"}
    for k in keys:
        got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
        want = [(row["training_iteration"], float(row[k])) for row in history if k in row]
        assert got == want, "%s: MLflow has %s; the run reported %s" % (k, got, want)


def test_a_trainers_run_is_logged_to_mlflow_as_rays_callback_logs_it(cluster, mlflow_server):
    cb = MLflowLoggerCallback(mlflow_server, experiment_name="py-train", tags={"team": "vision", "attempt": 1})
    r = TorchTrainer(linear_loop, train_loop_config={"epochs": 3, "lr": 0.05, "note": object()},
                     scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="mlflow-train", callbacks=[cb])).fit()
    assert r.state == "completed"
    client, runs = runs_tagged(mlflow_server, "py-train", "durabletrain.run", "mlflow-train")
    assert len(runs) == 1, [x.info for x in runs]
    run = runs[0]
    assert run.info.status == "FINISHED", run.info
    params = run.data.params
    assert params["train_loop_config/epochs"] == "3" and params["train_loop_config/lr"] == "0.05", params
    assert params["train_loop_config/note"].startswith("<object object"), params  # not JSON: str(), as Ray logs it
    assert params["num_workers"] == "2", params
    tags = run.data.tags
    assert tags["team"] == "vision" and tags["attempt"] == "1", tags
    assert tags["durabletrain.state"] == "completed", tags
    assert r.checkpoint is not None and r.checkpoint.path.rstrip("/").split("/")[-1] in tags["durabletrain.checkpoint"], (
        tags, r.checkpoint.path)
    check_metrics(client, run, r.metrics_history)
    assert len(client.get_metric_history(run.info.run_id, "loss")) == 3


def test_each_trial_of_a_search_is_an_mlflow_run(cluster, mlflow_server):
    cb = MLflowLoggerCallback(mlflow_server, experiment_name="py-tune")
    grid = tune.Tuner(TorchTrainer(linear_loop, train_loop_config={"epochs": 2}, scaling_config=ScalingConfig(num_workers=1)),
                      param_space={"train_loop_config": {"lr": tune.grid_search([0.01, 0.1])}},
                      tune_config=tune.TuneConfig(metric="loss", mode="min"),
                      run_config=RunConfig(name="mlflow-tune", callbacks=[cb])).fit()
    assert len(grid) == 2 and not grid.errors
    client, runs = runs_tagged(mlflow_server, "py-tune", "durabletrain.search", "mlflow-tune")
    assert len(runs) == 2, [x.info for x in runs]
    assert sorted(x.data.params["train_loop_config/lr"] for x in runs) == ["0.01", "0.1"]
    for res in grid:
        lr = res.config["train_loop_config"]["lr"] if "train_loop_config" in res.config else res.config["lr"]
        run = next(x for x in runs if x.data.params["train_loop_config/lr"] == str(lr))
        assert run.info.status == "FINISHED", run.info
        assert run.data.params["train_loop_config/epochs"] == "2", run.data.params
        assert run.data.tags["trial_name"], run.data.tags
        # A trial's result holds its last report: MLflow has every one, at steps 1..N, the last N's.
        hist = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
        assert [s for s, _ in hist] == [1, 2] and hist[-1][1] == res.metrics["loss"], (hist, res.metrics)


def scored(config):
    for i in range(2):
        train.report({"score": config["lr"] * (i + 1)})


def test_a_function_trainables_trials_log_their_config_as_itself(cluster, mlflow_server):
    """tune.run(fn, callbacks=[...]): Ray logs a function's config keys as
    they are ("lr"), not under train_loop_config."""
    analysis = tune.run(scored, config={"lr": tune.grid_search([1, 2]), "tag": "x"}, metric="score", mode="max",
                        name="mlflow-fn", verbose=0, callbacks=[MLflowLoggerCallback(mlflow_server, experiment_name="py-fn")])
    assert analysis.best_config["lr"] == 2
    client, runs = runs_tagged(mlflow_server, "py-fn", "durabletrain.search", "mlflow-fn")
    assert sorted(x.data.params["lr"] for x in runs) == ["1", "2"], [x.data.params for x in runs]
    assert all(x.data.params["tag"] == "x" and x.info.status == "FINISHED" for x in runs), [x.data.params for x in runs]
    for x in runs:
        assert [m.value for m in sorted(client.get_metric_history(x.info.run_id, "score"), key=lambda m: m.step)] == \
            [float(x.data.params["lr"]), 2.0 * float(x.data.params["lr"])]


@pytest.mark.parametrize("kwargs, field, says", [
    ({"tracking_uri": "file:///tmp/mlruns"}, "tracking_uri", "mlflow server"),
    ({"tracking_uri": "./mlruns"}, "tracking_uri", "mlflow server"),
    ({"tracking_uri": "sqlite:///mlflow.db"}, "tracking_uri", "mlflow server"),
    ({"tracking_uri": "databricks"}, "tracking_uri", "mlflow server"),
    ({"tracking_uri": "ftp://host/x"}, "tracking_uri", "http"),
    ({"tracking_uri": "http://user:secret@host:5000"}, "tracking_uri", ""),
    ({"registry_uri": "http://h:5000"}, "registry_uri", "registers no model"),
    ({"tracking_token": "t0ken"}, "tracking_token", "MLFLOW_TRACKING_TOKEN"),
    ({"save_artifact": True}, "save_artifact", "durabletrain.checkpoint"),
    ({"save_artifact": "yes"}, "save_artifact", "True or False"),
    ({"experiment_name": ""}, "experiment_name", "name of an experiment"),
    ({"experiment_name": "a\nb"}, "experiment_name", "one line"),
    ({"tags": ["a"]}, "tags", "dict"),
    ({"tags": {"durabletrain.run": "x"}}, "tags", "durabletrain."),
    ({"tags": {"k": "v" * 6000}}, "tags", "5000"),
])
def test_the_callbacks_arguments_are_checked_before_anything_starts(kwargs, field, says):
    kwargs = dict(kwargs)
    uri = kwargs.pop("tracking_uri", "http://127.0.0.1:5000")
    with pytest.raises((ValueError, TypeError)) as e:
        MLflowLoggerCallback(uri, **kwargs)
    msg = str(e.value)
    assert field in msg and says in msg, msg
    assert "t0ken" not in msg and "secret" not in msg, msg


def test_the_tracking_uri_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError, match="tracking_uri.*MLFLOW_TRACKING_URI"):
        MLflowLoggerCallback()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    cb = MLflowLoggerCallback()
    assert cb.to_spec() == {"tracking_uri": "http://mlflow.internal:5000", "experiment_name": "from-env"}


def test_run_config_takes_only_the_callbacks_it_carries_out():
    from durabletrain.air.integrations.mlflow import Callback

    class Mine(Callback):
        pass

    cb = MLflowLoggerCallback("http://127.0.0.1:5000")
    assert RunConfig(callbacks=[cb]).mlflow is cb
    assert RunConfig().mlflow is None
    for bad, says in [([Mine()], "callbacks[0]"), ([cb, object()], "callbacks[1]"), ([cb, cb], "second MLflowLoggerCallback"),
                      ("mlflow", "want a list"), ({"a": cb}, "want a list")]:
        with pytest.raises((ValueError, TypeError), match=r"RunConfig\.callbacks") as e:
            RunConfig(callbacks=bad)
        assert says in str(e.value), str(e.value)


def test_a_config_too_big_for_mlflow_is_logged_in_part_with_a_warning():
    from durabletrain._driver import MAX_TRACKER_PARAMS_BYTES, mlflow_params
    with pytest.warns(UserWarning, match="not logged to MLflow: big"):
        out = mlflow_params({"lr": 0.1, "big": "x" * 20000, "vocab": "y" * 3000, "layers": [64, 64], "nan": float("nan")},
                            "TorchTrainer")
    assert out == {"lr": 0.1, "vocab": "y" * 3000, "layers": "[64, 64]", "nan": "nan"}
    import json
    assert len(json.dumps(out)) <= MAX_TRACKER_PARAMS_BYTES
