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
