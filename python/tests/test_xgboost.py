"""XGBoost through durabletrain.train.xgboost, on a real local cluster: real
XGBoost in its own collective (the tracker on rank 0, 2 CPU ranks), real
signals. A run killed or preempted between rounds must end with the model an
unbroken run ends with."""

import os
import threading

import pytest

xgboost = pytest.importorskip("xgboost")
np = pytest.importorskip("numpy")

from durabletrain.train import CheckpointConfig, RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.xgboost import RayTrainReportCallback, XGBoostTrainer  # noqa: E402

from conftest import fit_with_a_rank_signalled, stop_the_worker_of, wait_for  # noqa: E402


def data(n=2000, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6))
    y = x @ np.array([1.5, -2.0, 0.5, 0.0, 3.0, -1.0]) + np.sin(3 * x[:, 0]) + rng.normal(scale=0.1, size=n)
    return x, y


def xgb_loop(config):
    """Ray Train's XGBoost recipe with its imports changed: each rank boosts
    on its own rows; a resumed rank starts from the checkpoint's booster."""
    import time
    import xgboost
    from durabletrain import train
    from durabletrain.train.xgboost import RayTrainReportCallback
    ctx = train.get_context()
    x, y = data()
    rows = slice(ctx.get_world_rank(), None, ctx.get_world_size())
    dtrain = xgboost.DMatrix(x[rows], label=y[rows])
    checkpoint = train.get_checkpoint()
    start = RayTrainReportCallback.get_model(checkpoint) if checkpoint else None
    rounds = config["rounds"] - (start.num_boosted_rounds() if start else 0)

    class Slow(xgboost.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            time.sleep(config.get("sleep", 0))
            if config.get("trace") and ctx.get_world_rank() == 0:
                with open(config["trace"], "a") as f:
                    f.write("%d\n" % epoch)
            return False
    params = {"objective": "reg:squarederror", "tree_method": "hist", "max_depth": 4, "eta": config.get("eta", 0.2), "seed": 0}
    xgboost.train(params, dtrain, num_boost_round=rounds, xgb_model=start, evals=[(dtrain, "train")],
                  callbacks=[Slow(), RayTrainReportCallback(frequency=config.get("frequency", 0))])


CONFIG = {"rounds": 30, "sleep": 0.1}


def model_of(result):
    return RayTrainReportCallback.get_model(result.checkpoint)


@pytest.fixture(scope="module")
def unbroken(cluster):
    return XGBoostTrainer(xgb_loop, train_loop_config=CONFIG, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="xgb-unbroken")).fit()


def test_xgboost_trains_one_model_over_every_ranks_rows(unbroken):
    r = unbroken
    assert r.state == "completed" and r.failures == 0, r.progress
    assert r.metrics["rounds"] == 30, r.metrics
    booster = model_of(r)
    assert booster.num_boosted_rounds() == 30
    # The reported train-rmse is the collective's, over both ranks' rows: the
    # final model's error on all of them. A rank that boosted alone on its
    # half would report its half's.
    x, y = data()
    rmse = float(np.sqrt(np.mean((booster.predict(xgboost.DMatrix(x)) - y) ** 2)))
    assert abs(rmse - r.metrics["train-rmse"]) < 1e-4, (rmse, r.metrics)
    alone = xgboost.train({"objective": "reg:squarederror", "tree_method": "hist", "max_depth": 4, "eta": 0.2, "seed": 0},
                          xgboost.DMatrix(x[0::2], label=y[0::2]), num_boost_round=30)
    assert booster.save_raw() != alone.save_raw(), "the run's model is rank 0's alone"


def test_a_rank_killed_between_rounds_resumes_at_its_last_saved_round(cluster, unbroken):
    name = "xgb-killed"
    t = XGBoostTrainer(xgb_loop, train_loop_config=dict(CONFIG, frequency=4), scaling_config=ScalingConfig(num_workers=2),
                       run_config=RunConfig(name=name))
    r, restored, _ = fit_with_a_rank_signalled(cluster, t, name, "ckpt-e000000-s", 8, timeout=240)
    assert " epoch 0 step 0" not in restored, restored
    assert model_of(r).save_raw() == model_of(unbroken).save_raw(), "the resumed run's model differs from the unbroken one's"


def test_a_worker_told_to_stop_saves_at_one_round_and_the_model_is_the_unbroken_ones(cluster, unbroken, tmp_path):
    name = "xgb-preempted"
    trace = str(tmp_path / "rounds")
    t = XGBoostTrainer(xgb_loop, train_loop_config=dict(CONFIG, trace=trace), scaling_config=ScalingConfig(num_workers=2),
                       run_config=RunConfig(name=name))
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", t.fit()))
    th.start()
    wait_for("round 10", lambda: os.path.exists(trace) and "\n10\n" in open(trace).read(), every=0.02)
    stop_the_worker_of(cluster, name, "durabletrain-local-after-xgboost")
    th.join(240)
    r = out["r"]
    assert r.state == "completed" and r.failures == 0 and r.preemptions == 1, r.progress
    stops = [i for i in r.incidents if i["kind"] == "preemption"]
    assert stops and "checkpointed at epoch 0 step" in stops[0]["detail"], r.incidents
    assert model_of(r).save_raw() == model_of(unbroken).save_raw(), "the resumed run's model differs from the unbroken one's"


def test_the_callback_refuses_a_bad_frequency_naming_it():
    with pytest.raises(ValueError, match=r"RayTrainReportCallback.frequency is -1; want 0"):
        RayTrainReportCallback(frequency=-1)


def test_an_xgboost_trainer_is_tuned_as_a_tuner_trial(cluster):
    from durabletrain import tune
    trainer = XGBoostTrainer(xgb_loop, train_loop_config={"rounds": 10}, scaling_config=ScalingConfig(num_workers=2))
    grid = tune.Tuner(trainer, param_space={"train_loop_config": {"eta": tune.grid_search([0.3, 0.01])}},
                      tune_config=tune.TuneConfig(metric="train-rmse", mode="min", max_concurrent_trials=1),
                      run_config=RunConfig(name="tune-xgboost")).fit()
    assert len(grid) == 2 and grid.num_errors == 0, grid.errors
    best = grid.get_best_result()
    assert best.config["eta"] == 0.3 and RayTrainReportCallback.get_model(best.checkpoint).num_boosted_rounds() == 10, best
