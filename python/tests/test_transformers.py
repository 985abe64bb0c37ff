"""Hugging Face Transformers through durabletrain.train.huggingface.transformers,
on a real local cluster: a tiny BERT built from its config (no hub download),
the real transformers.Trainer on 2 gloo ranks, real signals."""

import os
import threading

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from durabletrain.train import CheckpointConfig, RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.torch import TorchTrainer  # noqa: E402

from conftest import fit_with_a_rank_signalled, stop_the_worker_of, wait_for  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def hf_loop(config):
    """Ray Train's Transformers recipe with its imports changed. The model
    counts, per epoch, how often this rank trained each sample: a buffer
    saved in its checkpoint."""
    import os
    import time
    import torch
    import transformers
    from durabletrain import train
    from durabletrain.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    n, epochs = config["n"], config["epochs"]

    class Counted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32, max_position_embeddings=16, num_labels=2)
            self.bert = transformers.BertForSequenceClassification(cfg)
            self.register_buffer("counts", torch.zeros(epochs, n))
            self.epoch = 0

        def forward(self, input_ids, attention_mask, labels, idx):
            if self.training:
                self.counts[self.epoch, idx] += 1
                time.sleep(config.get("sleep", 0))
            return self.bert(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(1, 64, (8,), generator=g)
            return {"input_ids": ids, "attention_mask": torch.ones(8, dtype=torch.long), "labels": int(ids[0] % 2), "idx": i}

    class Epoch(transformers.TrainerCallback):
        def on_epoch_begin(self, args, state, control, model=None, **kw):
            inner = model.module if hasattr(model, "module") else model
            inner.epoch = int(state.epoch or 0)

        def on_step_end(self, args, state, control, **kw):
            if config.get("trace") and args.process_index == 0:
                with open(config["trace"], "a") as f:
                    f.write("%d\n" % state.global_step)

    model = Counted()
    args = transformers.TrainingArguments(output_dir="out", per_device_train_batch_size=4, num_train_epochs=epochs,
                                          learning_rate=config.get("lr", 1e-3), lr_scheduler_type=config.get("schedule", "linear"), logging_steps=2, save_strategy="no", eval_strategy="epoch",
                                          report_to="none", use_cpu=True, seed=7, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Samples(), eval_dataset=Samples(),
                                   callbacks=[Epoch()])
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    trainer.train()
    if config.get("world_check"):
        train.report({"world": trainer.args.world_size})


@pytest.fixture(autouse=True, scope="module")
def driver_dir(tmp_path_factory):
    """The driver's working directory, where a local cluster's ranks start."""
    old = os.getcwd()
    d = tmp_path_factory.mktemp("driver")
    os.chdir(str(d))
    yield d
    os.chdir(old)


CONFIG = {"n": 64, "epochs": 3, "per_epoch": 8, "sleep": 0.05}


def counts_of(result):
    from safetensors.torch import load_file
    with result.checkpoint.as_directory() as d:
        return load_file(os.path.join(d, "checkpoint", "model.safetensors"))["counts"]


@pytest.fixture(scope="module")
def unbroken(cluster, driver_dir):
    return TorchTrainer(hf_loop, train_loop_config=CONFIG, scaling_config=ScalingConfig(num_workers=2),
                        run_config=RunConfig(name="hf-unbroken")).fit()


def test_a_transformers_trainer_reports_each_epoch_with_its_checkpoint(unbroken):
    r = unbroken
    assert r.state == "completed" and r.failures == 0, r.progress
    assert [int(m["training_iteration"]) for m in r.metrics_history] == [1, 2, 3], r.metrics_history
    last = r.metrics
    assert last["step"] == 24 and "eval_loss" in last and "loss" in last and "learning_rate" in last, last
    with r.checkpoint.as_directory() as d:
        # Laid out as Ray Train's callback lays it out: the Trainer's checkpoint in checkpoint/.
        assert os.listdir(d) == ["checkpoint"], os.listdir(d)
        inner = os.path.join(d, "checkpoint")
        assert {"trainer_state.json", "optimizer.pt", "scheduler.pt", "model.safetensors"} <= set(os.listdir(inner)), os.listdir(inner)
    # output_dir="out" is each rank's own, not the driver's working directory (where the ranks start):
    # no checkpoint there, at most the empty directory the Trainer makes when it is built.
    assert not os.path.exists("out") or os.listdir("out") == [], os.listdir("out")
    counts = counts_of(r)
    # Two ranks, each its own half: rank 0 trained 32 samples once each epoch, the other 32 never.
    for e in range(3):
        assert sorted(set(counts[e].tolist())) == [0.0, 1.0] and counts[e].sum() == 32, counts[e]


def test_a_rank_killed_mid_epoch_resumes_at_its_step_checkpoint_and_trains_each_sample_once(cluster, unbroken):
    name = "hf-killed"
    t = TorchTrainer(hf_loop, train_loop_config=CONFIG, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name=name, checkpoint_config=CheckpointConfig(checkpoint_every_steps=3)))
    r, restored, _ = fit_with_a_rank_signalled(cluster, t, name, "ckpt-e000001-s")
    assert any(" epoch 1 step %d" % s in restored for s in (3, 6)), restored
    assert torch.equal(counts_of(r), counts_of(unbroken)), (counts_of(r), counts_of(unbroken))


def test_a_worker_told_to_stop_saves_at_one_step_and_the_run_loses_none(cluster, unbroken, tmp_path):
    name = "hf-preempted"
    trace = str(tmp_path / "steps")
    t = TorchTrainer(hf_loop, train_loop_config=dict(CONFIG, sleep=0.15, trace=trace), scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name=name))
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", t.fit()))
    th.start()
    wait_for("step 2 of epoch 1", lambda: os.path.exists(trace) and "\n%d\n" % (CONFIG["per_epoch"] + 2) in open(trace).read(), every=0.02)
    stop_the_worker_of(cluster, name, "durabletrain-local-after-hf")
    th.join(300)
    r = out["r"]
    assert r.state == "completed" and r.failures == 0 and r.preemptions == 1, r.progress
    stops = [i for i in r.incidents if i["kind"] == "preemption"]
    assert stops and "checkpointed at epoch 1 step" in stops[0]["detail"], r.incidents
    assert torch.equal(counts_of(r), counts_of(unbroken))



def test_prepare_trainer_refuses_a_trainer_whose_ranks_would_each_train_alone(tmp_path):
    """The known trap on CPU: a Trainer that sees one process where the run
    has several (each rank training alone on the whole data set)."""
    import subprocess
    import sys
    import textwrap
    prog = textwrap.dedent("""
        import os, torch, transformers
        args = transformers.TrainingArguments(output_dir=%r, use_cpu=True, report_to="none")
        trainer = transformers.Trainer(model=torch.nn.Linear(2, 2), args=args)
        os.environ.update(WORLD_SIZE="2", RANK="1")  # as a run of 2 ranks gives rank 1
        from durabletrain.train.huggingface.transformers import prepare_trainer
        try:
            prepare_trainer(trainer)
        except ValueError as e:
            print("REFUSED", e)
    """ % str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, timeout=120)
    assert "REFUSED prepare_trainer: the Trainer sees 1 process(es), this one number 0, where the run has 2 ranks and this is rank 1" in out.stdout, out.stdout + out.stderr


def test_pbt_clones_a_better_transformers_trials_checkpoint_and_trains_on_at_its_own_rate(cluster):
    """PBT on a Trainer's trials: an exploit resumes one trial from another's
    checkpoint (optimizer and scheduler included) with a perturbed learning
    rate, which the resumed Trainer then trains at, not the donor's.

    One slot for two trials: the population time-shares it, a trial pausing at
    each perturbation point. The stop criterion tells the search where the
    trials end, as Ray's PBT examples give it: without it a function trainer's
    end is known only once it has returned, and a donor paused at its last
    checkpoint (its stop came as it finished) could be cloned, which leaves the
    clone nothing to train (CI, 2026-12-07)."""
    from durabletrain import tune
    trainer = TorchTrainer(hf_loop, train_loop_config=dict(CONFIG, epochs=4, sleep=0.2, schedule="constant"),
                           scaling_config=ScalingConfig(num_workers=1))
    pbt = tune.PopulationBasedTraining(perturbation_interval=1, quantile_fraction=0.5, resample_probability=0.0,
                                       hyperparam_mutations={"train_loop_config": {"lr": tune.loguniform(1e-5, 1e-1)}})
    grid = tune.Tuner(trainer, param_space={"train_loop_config": {"lr": tune.grid_search([3e-3, 1e-6])}},
                      tune_config=tune.TuneConfig(metric="eval_loss", mode="min", scheduler=pbt, max_concurrent_trials=1, seed=1),
                      run_config=RunConfig(name="tune-pbt-hf", stop={"training_iteration": 4})).fit()
    rows = grid.raw["trials"]
    # A clone that trained on after its exploit (one of a donor's last epoch has nothing left to train).
    cloned = [t for t in rows if (t.get("lineage") or [{}])[-1].get("cloned") and int(t["lineage"][-1]["cloned"].split("-e")[-1][:6]) < 4]
    assert cloned, [(t["status"], t.get("lineage"), t.get("reason")) for t in rows]
    # Each ended at its stop criterion: told to stop there, or ended there as the stop came.
    assert all(t["status"] in ("completed", "stopped") and t["epochs"] == 4 for t in rows), \
        [(t["status"], t.get("reason"), t["metrics"]) for t in rows]
    for t in cloned:
        lr = t["config"]["config.lr"]
        assert abs(t["metrics"]["learning_rate"] - lr) <= 1e-9 * max(1.0, lr), (t["metrics"], t["config"], t["lineage"])
