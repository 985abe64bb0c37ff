# XGBoost on Ray Train, as Ray's "Get Started with Distributed Training using XGBoost"
# guide writes it (data-parallel boosting over XGBoost's own collective, a report and a
# checkpoint each round): ray_xgboost_classifier.py runs it on Ray,
# durabletrain_xgboost_classifier.py on durabletrain; they differ in their imports only
# (`diff` them). Each worker reads its own part of the data (the rows of its rank), where
# the guide hands it a Ray Data shard; the data are generated, a binary classification
# of 20 features. NUM_WORKERS and ROUNDS set the scale, for CI's 2 CPU ranks.
import os

import numpy as np
import xgboost

import ray.train
from ray.train import ScalingConfig, RunConfig, CheckpointConfig
from ray.train.xgboost import XGBoostTrainer, RayTrainReportCallback

rounds = int(os.environ.get("ROUNDS", "20"))


def rows(n, seed):
    """n rows of 20 features and a 0/1 label that depends on five of them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 20)).astype(np.float32)
    y = (x[:, :5].sum(axis=1) + 0.5 * rng.normal(size=n) > 0).astype(np.float32)
    return x, y


def train_func(config):
    # [1] Each worker's part of the data.
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    train_x, train_y = rows(4000, seed=0)
    eval_x, eval_y = rows(1000, seed=1)
    dtrain = xgboost.DMatrix(train_x[rank::world], label=train_y[rank::world])
    deval = xgboost.DMatrix(eval_x[rank::world], label=eval_y[rank::world])

    # [2] Resume from the last checkpoint, if any.
    checkpoint = ray.train.get_checkpoint()
    booster = None
    if checkpoint:
        booster = RayTrainReportCallback.get_model(checkpoint)

    # [3] Train, reporting the evaluation metrics and a checkpoint each round.
    xgboost.train(
        config["params"],
        dtrain=dtrain,
        evals=[(dtrain, "train"), (deval, "validation")],
        num_boost_round=rounds - (booster.num_boosted_rounds() if booster else 0),
        xgb_model=booster,
        callbacks=[RayTrainReportCallback(metrics={"validation-logloss": "validation-logloss",
                                                   "validation-error": "validation-error"},
                                          frequency=1)],
    )


params = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"], "tree_method": "hist",
          "max_depth": 4, "eta": 0.3}

# [4] Define the trainer: the number of workers and their resources.
trainer = XGBoostTrainer(
    train_func,
    train_loop_config={"params": params},
    scaling_config=ScalingConfig(num_workers=int(os.environ.get("NUM_WORKERS", "2"))),
    run_config=RunConfig(name="xgboost_classifier", checkpoint_config=CheckpointConfig(num_to_keep=2)),
)
result = trainer.fit()

# [5] Load the trained model.
booster = RayTrainReportCallback.get_model(result.checkpoint)
print("rounds", booster.num_boosted_rounds(), "validation-error", result.metrics["validation-error"])
