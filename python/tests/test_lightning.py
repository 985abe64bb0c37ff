"""Lightning 2.x through durabletrain.train.lightning, on a real local
cluster: real Lightning, real gloo ranks, real signals. A run killed or
preempted mid-epoch must train exactly the batches a run never stopped
trains, in the same order, none twice."""

import json
import os
import threading

import pytest

pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from durabletrain.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.torch import TorchTrainer  # noqa: E402

from conftest import fit_with_a_rank_signalled, stop_the_worker_of, wait_for  # noqa: E402


def lightning_loop(config):
    """Ray Train's Lightning recipe, unchanged but for its imports; the
    module records the batches of indices it trained, in its checkpoint."""
    import time
    import lightning.pytorch as pl
    import torch
    from durabletrain.train.lightning import RayDDPStrategy, RayFSDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    class Indices(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            (x,) = batch
            self.seen.append([self.current_epoch, batch_idx] + x.tolist())
            if config.get("trace") and self.global_rank == 0:
                with open(config["trace"], "a") as f:
                    f.write("%d %d\n" % (self.current_epoch, batch_idx))
            time.sleep(config.get("sleep", 0))
            loss = torch.nn.functional.mse_loss(self.layer(x.float().unsqueeze(-1) / 100).squeeze(-1), torch.zeros(len(x)))
            self.log("train_loss", loss, sync_dist=True)
            return loss

        def on_fit_start(self):
            if config.get("places"):
                t = self.trainer
                with open(config["places"], "a") as f:
                    f.write("%d %d %d %d %d\n" % (t.global_rank, t.local_rank, t.node_rank, t.world_size, t.num_nodes))

        def validation_step(self, batch, batch_idx):
            (x,) = batch
            self.log("val_loss", self.layer(x.float().unsqueeze(-1) / 100).pow(2).mean(), sync_dist=True)

        def configure_optimizers(self):
            if config.get("fsdp"):  # a stateful optimizer: its state is sharded too (Lightning cannot load an empty one)
                return torch.optim.Adam(self.parameters(), lr=config.get("lr", 0.01))
            return torch.optim.SGD(self.parameters(), lr=config.get("lr", 0.1))

        def on_save_checkpoint(self, checkpoint):
            checkpoint["seen"] = self.seen

        def on_load_checkpoint(self, checkpoint):
            self.seen = checkpoint["seen"]

    torch.manual_seed(0)  # every run starts from the same weights
    ds = torch.utils.data.TensorDataset(torch.arange(config["n"]))
    train_loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True)
    val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(16)), batch_size=4)
    strategy = RayFSDPStrategy(state_dict_type="sharded") if config.get("fsdp") else RayDDPStrategy()
    trainer = pl.Trainer(max_epochs=config["epochs"], devices="auto", accelerator="auto", strategy=strategy,
                         plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()], enable_checkpointing=False,
                         enable_progress_bar=False, logger=False, log_every_n_steps=2)
    trainer = prepare_trainer(trainer)
    trainer.fit(Indices(), train_dataloaders=train_loader, val_dataloaders=val_loader)


def seen_of(result):
    with result.checkpoint.as_directory() as d:
        ckpt = torch.load(os.path.join(d, "checkpoint.ckpt"), weights_only=False)
    return ckpt["seen"], ckpt


CONFIG = {"n": 96, "epochs": 3, "sleep": 0.05}


@pytest.fixture(scope="module")
def unbroken(cluster):
    """The run never stopped: what the others must equal."""
    r = TorchTrainer(lightning_loop, train_loop_config=CONFIG, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="lightning-unbroken")).fit()
    return r


def test_a_lightning_fit_reports_each_epoch_with_a_checkpoint(unbroken):
    r = unbroken
    assert r.state == "completed" and r.failures == 0, r.progress
    assert [m["epoch"] for m in r.metrics_history] == [0, 1, 2], r.metrics_history
    assert r.metrics["training_iteration"] == 3 and r.metrics["step"] == 36, r.metrics
    assert "train_loss" in r.metrics and "val_loss" in r.metrics, r.metrics
    seen, ckpt = seen_of(r)
    assert ckpt["epoch"] == 2 and ckpt["global_step"] == 36, {k: ckpt[k] for k in ("epoch", "global_step")}
    # Rank 0's shard: 12 batches of 4 per epoch, each sample of its half once an epoch.
    assert len(seen) == 36 and [s[1] for s in seen[:12]] == list(range(12)), seen
    for e in range(3):
        idx = sorted(i for s in seen if s[0] == e for i in s[2:])
        assert len(idx) == 48 and len(set(idx)) == 48, idx


def test_a_rank_killed_mid_epoch_resumes_at_its_last_step_checkpoint_on_the_batches_not_trained(cluster, unbroken):
    name = "lightning-killed"
    t = TorchTrainer(lightning_loop, train_loop_config=CONFIG, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name=name, checkpoint_config=CheckpointConfig(checkpoint_every_steps=5)))
    r, restored, _ = fit_with_a_rank_signalled(cluster, t, name, "ckpt-e000001-s", timeout=240)
    assert any(" epoch 1 step %d" % s in restored for s in (5, 10)), restored
    seen, _ = seen_of(r)
    want, _ = seen_of(unbroken)
    assert seen == want, "rank 0 trained %s; the run never stopped trained %s" % (seen, want)


def test_a_worker_told_to_stop_saves_every_rank_at_one_step_and_the_run_loses_none(cluster, unbroken, tmp_path):
    """SIGTERM to the worker that holds the ranks: they stop at one agreed
    batch, save there, and a new worker's ranks resume at that batch."""
    name = "lightning-preempted"
    trace = str(tmp_path / "steps")
    t = TorchTrainer(lightning_loop, train_loop_config=dict(CONFIG, sleep=0.1, trace=trace), scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name=name, failure_config=FailureConfig(max_failures=0)))
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", t.fit()))
    th.start()
    wait_for("batch 3 of epoch 1", lambda: os.path.exists(trace) and "1 3\n" in open(trace).read(), every=0.02)
    stop_the_worker_of(cluster, name, "durabletrain-local-after-lightning")
    th.join(240)
    r = out["r"]
    assert r.state == "completed" and r.failures == 0 and r.preemptions == 1, r.progress
    stops = [i for i in r.incidents if i["kind"] == "preemption"]
    assert stops and "checkpointed at epoch 1 step" in stops[0]["detail"], r.incidents
    seen, _ = seen_of(r)
    want, _ = seen_of(unbroken)
    assert seen == want, "rank 0 trained %s; the run never stopped trained %s" % (seen, want)


def test_two_ranks_on_one_host_are_one_node_of_two_local_ranks(cluster, unbroken, tmp_path):
    """workers_per_host 2: both ranks on one host. Lightning sees them as
    local ranks 0 and 1 of node 0 of 1, in a world of 2, and trains what
    two ranks on two hosts train."""
    places = str(tmp_path / "places")
    r = TorchTrainer(lightning_loop, train_loop_config=dict(CONFIG, places=places),
                     scaling_config=ScalingConfig(num_workers=2, workers_per_host=2),
                     run_config=RunConfig(name="lightning-one-host")).fit()
    assert r.state == "completed" and r.failures == 0, r.progress
    assert sorted(open(places).read().split("\n")[:-1]) == ["0 0 0 2 1", "1 1 0 2 1"], open(places).read()
    seen, _ = seen_of(r)
    want, _ = seen_of(unbroken)
    assert seen == want, "rank 0 trained %s; two hosts trained %s" % (seen, want)


def test_prepare_trainer_refuses_a_plain_strategy_naming_it():
    import lightning.pytorch as pl
    from durabletrain.train.lightning import prepare_trainer
    trainer = pl.Trainer(max_epochs=1, strategy="auto", logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"Trainer\(strategy=SingleDeviceStrategy\); want strategy=RayDDPStrategy\(\)"):
        prepare_trainer(trainer)


def test_asha_stops_a_lightning_trial_early(cluster):
    """Each Lightning epoch is a trial's iteration: ASHA compares them and
    stops the trials whose learning rate cannot train."""
    from durabletrain import tune
    trainer = TorchTrainer(lightning_loop, train_loop_config={"n": 64, "epochs": 4}, scaling_config=ScalingConfig(num_workers=1))
    grid = tune.Tuner(trainer, param_space={"train_loop_config": {"lr": tune.grid_search([0.5, 0.3, 1e-6, 1e-7])}},
                      tune_config=tune.TuneConfig(metric="val_loss", mode="min", max_concurrent_trials=2,
                                                  scheduler=tune.ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)),
                      run_config=RunConfig(name="tune-asha-lightning")).fit()
    statuses = [r.status for r in grid]
    assert set(statuses) <= {"completed", "early-stopped"} and "early-stopped" in statuses, [(r.status, r.reason) for r in grid]
    best = grid.get_best_result()
    assert best.config["lr"] in (0.5, 0.3), best
    with best.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "checkpoint.ckpt"), weights_only=False)["epoch"] == best.metrics["training_iteration"] - 1


def fsdp_state_of(result):
    """A sharded (FSDP) checkpoint's parts, as as_directory() hands them over:
    one torch.distributed.checkpoint directory, every rank's shard in it;
    its model and optimizer state gathered whole, and rank 0's loop state."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with result.checkpoint.as_directory() as d:
        ck = os.path.join(d, "checkpoint.ckpt")
        files = sorted(os.listdir(ck))
        whole = os.path.join(d, "whole.pt")
        dcp_to_torch_save(ck, whole)
        return files, torch.load(whole, weights_only=False), torch.load(os.path.join(ck, "meta.pt"), weights_only=False)


def test_a_sharded_fsdp_run_killed_mid_epoch_resumes_with_every_ranks_part(cluster):
    """RayFSDPStrategy(state_dict_type="sharded") on 2 CPU ranks: each rank
    saves its own shard, CheckpointConfig(sharded=True) keeps both, and a rank
    killed mid-epoch resumes, on every rank, from both parts: the run ends
    with the model, the optimizer state and the batches of a run never stopped."""
    cfg = dict(CONFIG, fsdp=True)
    unbroken = TorchTrainer(lightning_loop, train_loop_config=cfg, scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="lightning-fsdp-unbroken", checkpoint_config=CheckpointConfig(sharded=True))).fit()
    assert unbroken.state == "completed" and unbroken.failures == 0, unbroken.progress
    files, want, want_meta = fsdp_state_of(unbroken)
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"} <= set(files), files

    name = "lightning-fsdp-killed"
    t = TorchTrainer(lightning_loop, train_loop_config=cfg, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name=name, checkpoint_config=CheckpointConfig(sharded=True, checkpoint_every_steps=5)))
    r, restored, _ = fit_with_a_rank_signalled(cluster, t, name, "ckpt-e000001-s")
    assert any(" epoch 1 step %d" % s in restored for s in (5, 10)), restored
    _, got, meta = fsdp_state_of(r)
    assert meta["seen"] == want_meta["seen"], "rank 0 trained %s; the run never stopped trained %s" % (meta["seen"], want_meta["seen"])
    assert meta["global_step"] == want_meta["global_step"] == 36, (meta["global_step"], want_meta["global_step"])
    for part in ("model", "optimizer_0"):
        flat_got, flat_want = _tensors(got[part]), _tensors(want[part])
        assert flat_got.keys() == flat_want.keys(), (flat_got.keys(), flat_want.keys())
        for k in flat_want:
            assert torch.equal(flat_got[k], flat_want[k]), "%s %s: %s after the resume; %s unbroken" % (part, k, flat_got[k], flat_want[k])


def _tensors(tree, prefix=""):
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_tensors(v, "%s/%s" % (prefix, k)))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(_tensors(v, "%s/%d" % (prefix, i)))
    elif isinstance(tree, torch.Tensor):
        out[prefix] = tree
    return out
