"""Tuner(...).fit() and tune.run over real TuneWorkflows: every trial a
child training workflow on the real local cluster."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from durabletrain import tune  # noqa: E402
from durabletrain.train import RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.torch import TorchTrainer  # noqa: E402

from conftest import REPO, SUBSET  # noqa: E402
from test_fit import linear_loop  # noqa: E402


def test_a_tuner_with_asha_finds_the_learning_rate_that_trains(cluster):
    trainer = TorchTrainer(linear_loop, train_loop_config={"epochs": 4}, scaling_config=ScalingConfig(num_workers=1))
    tuner = tune.Tuner(trainer, param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 0.05, 1e-4, 1e-5])}},
                       tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=tune.ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2),
                                                   max_concurrent_trials=2),
                       run_config=RunConfig(name="tune-asha-linear"))
    grid = tuner.fit()
    assert len(grid) == 4
    statuses = sorted(r.status for r in grid)
    assert set(statuses) <= {"completed", "early-stopped"}, [(r.status, r.reason) for r in grid]
    assert "early-stopped" in statuses, "ASHA stopped neither of the 2 trials whose learning rates are 3 decades too small, run after the good ones"
    best = grid.get_best_result()
    assert best.config["lr"] in (0.05, 0.1), best
    assert best.checkpoint is not None
    with best.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "state.pt"))["epoch"] == 3
    df = grid.get_dataframe()
    assert len(df) == 4 and "config/lr" in df.columns


def test_the_ported_reference_search_runs(cluster, tmp_path):
    script = os.path.join(REPO, "examples", "ray_to_durabletrain", "durabletrain_tune_mnist.py")
    env = dict(os.environ, NUM_SAMPLES="4", ITERATIONS="3", FASHION_MNIST=SUBSET, MNIST_LIMIT="1024", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, script], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert "Best config is: {" in out.stdout, out.stdout
    import pandas
    df = pandas.read_csv(tmp_path / "result.csv")
    assert len(df) == 4, df
    assert set(df["status"]) <= {"completed", "early-stopped"}, df
    assert {"config/lr", "config/momentum", "mean_accuracy"} <= set(df.columns), df.columns


RESTORABLE_SEARCH = '''
import json, os, sys, time
from durabletrain import train, tune
from durabletrain.train import RunConfig

def objective(config):
    for i in range(1, 4):
        time.sleep(0.4)
        train.report({"score": config["x"] * i})

name = sys.argv[1]
path = os.path.join(sys.argv[2], name)
# Ray Tune's documented pattern: the same script again after its driver died.
if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, trainable=objective)
    print("restored", flush=True)
else:
    tuner = tune.Tuner(objective, param_space={"x": tune.grid_search([1, 2, 3, 4])},
                       tune_config=tune.TuneConfig(metric="score", mode="max", max_concurrent_trials=2),
                       run_config=RunConfig(name=name, storage_path=sys.argv[2]))
grid = tuner.fit()
best = grid.get_best_result()
print(json.dumps({"trials": [[r.workflow_id, r.status, r.iterations, r.metrics.get("score")] for r in grid],
                  "best": best.config}), flush=True)
'''


def test_a_search_whose_driver_is_killed_is_restored_by_running_the_script_again(cluster, tmp_path):
    """Ray Tune's fault tolerance: the driver SIGKILLed mid-search and the
    script run again, which calls Tuner.restore. Here the search never
    stopped: the second driver attaches, and no trial trains again."""
    import json
    import signal
    import time
    from conftest import wait_for
    script = tmp_path / "search.py"
    script.write_text(RESTORABLE_SEARCH)
    name = "restorable-search"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.Popen([sys.executable, str(script), name, cluster.storage], cwd=str(tmp_path), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = cluster.client()

    def a_trial_reported():
        try:
            r = cluster.loop.run(client.get_workflow_handle(name).query("results"))
        except Exception:
            return False
        return any(t.get("epochs", 0) >= 1 for t in r.get("trials") or [])
    try:
        wait_for("a trial's first report", a_trial_reported, timeout=180, every=0.2)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    killed_at = time.time()
    second = subprocess.run([sys.executable, str(script), name, cluster.storage], cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]
    assert "restored" in second.stdout, second.stdout
    got = json.loads(second.stdout.strip().splitlines()[-1])
    trials = got["trials"]
    assert len(trials) == 4 and all(t[1] == "completed" and t[2] == 3 for t in trials), trials
    assert got["best"]["x"] == 4 and sorted(t[3] for t in trials) == [3, 6, 9, 12], got
    # No trial started again: each trial's workflow has one run, started before or after the kill once.
    for wid, *_ in trials:
        runs = cluster.loop.run(_runs_of(client, wid))
        assert runs == 1, "trial %s ran %d times" % (wid, runs)
    assert time.time() - killed_at < 300


async def _runs_of(client, workflow_id):
    n = 0
    async for _ in client.list_workflows('WorkflowId = "%s"' % workflow_id):
        n += 1
    return n


def test_restore_names_what_it_cannot_restore(cluster):
    assert not tune.Tuner.can_restore("/nowhere/no-such-search")
    with pytest.raises(ValueError, match=r"Tuner.restore: path '/nowhere/no-such-search' names the search 'no-such-search'"):
        tune.Tuner.restore("/nowhere/no-such-search", trainable=linear_loop)
    with pytest.raises(ValueError, match="resume_errored=True"):
        tune.Tuner.restore("x", trainable=linear_loop, resume_errored=True)
    with pytest.raises(ValueError, match="path is ''"):
        tune.Tuner.can_restore("")


def test_the_schedulers_take_rays_arguments_and_refuse_what_a_durable_search_cannot_do():
    """Ray's PBT example's scheduler, as written there, and the arguments
    that cannot be honoured refused by name."""
    pbt = tune.PopulationBasedTraining(time_attr="training_iteration", metric="mean_accuracy", mode="max", perturbation_interval=5,
                                       hyperparam_mutations={"lr": tune.uniform(0.0001, 1), "momentum": [0.8, 0.9, 0.99]})
    assert pbt.to_spec()["hyperparam_mutations"] == {"config.lr": {"uniform": [0.0001, 1]}, "config.momentum": {"choice": [0.8, 0.9, 0.99]}}
    assert tune.TuneConfig(scheduler=pbt).scheduler.metric == "mean_accuracy"
    asha = tune.AsyncHyperBandScheduler(time_attr="training_iteration", metric="loss", mode="min", max_t=9, grace_period=1, reduction_factor=3)
    assert asha.to_spec() == {"type": "asha", "max_t": 9, "grace_period": 1, "reduction_factor": 3}
    for make, field in [(lambda: tune.PopulationBasedTraining(time_attr="time_total_s"), "time_attr"),
                        (lambda: tune.PopulationBasedTraining(custom_explore_fn=lambda c: c), "custom_explore_fn"),
                        (lambda: tune.PopulationBasedTraining(perturbation_factors=(2, 0.5)), "perturbation_factors"),
                        (lambda: tune.PopulationBasedTraining(synch=True), "synch"),
                        (lambda: tune.PopulationBasedTraining(burn_in_period=5), "burn_in_period"),
                        (lambda: tune.PopulationBasedTraining(perturbation_interval=0), "perturbation_interval"),
                        (lambda: tune.PopulationBasedTraining(hyperparam_mutations={"lr": lambda: 0.1}), "hyperparam_mutations['lr']"),
                        (lambda: tune.ASHAScheduler(time_attr="time_total_s"), "time_attr"),
                        (lambda: tune.ASHAScheduler(brackets=3), "brackets"),
                        (lambda: tune.ASHAScheduler(mode="best"), "mode"),
                        (lambda: tune.MedianStoppingRule(hard_stop=False), "hard_stop")]:
        with pytest.raises((ValueError, TypeError)) as e:
            make()
        assert field in str(e.value), str(e.value)


def test_tune_run_takes_rays_arguments_and_names_the_ones_it_cannot():
    """Ray's harmless arguments pass, one that would change the search is
    refused with why, an unknown one is a TypeError naming it (before, any
    was dropped without a word)."""
    for kwargs, err, says in [({"fail_fast": True}, ValueError, "fail_fast=True"),
                              ({"time_budget_s": 60}, ValueError, "time_budget_s=60"),
                              ({"num_sample": 4}, TypeError, "'num_sample'"),
                              ({"local_dir": "/a", "storage_path": "/b"}, ValueError, "local_dir"),
                              ({"max_failures": -2}, ValueError, "max_failures")]:
        with pytest.raises(err) as e:
            tune.run(linear_loop, config={"epochs": 1}, verbose=0, **kwargs)
        assert says in str(e.value), str(e.value)
