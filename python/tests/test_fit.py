"""TorchTrainer(...).fit() against a real local cluster: real Temporal, real
worker processes, real PyTorch ranks (gloo), real signals."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from durabletrain import train  # noqa: E402
from durabletrain.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.torch import TorchTrainer  # noqa: E402

from conftest import fit_with_a_rank_signalled, rank_pids, wait_for  # noqa: E402


def linear_loop(config):
    """A Ray-style function: its own epochs, a checkpoint per report, resumes from get_checkpoint()."""
    import os, tempfile, time
    import torch
    from durabletrain import train
    from durabletrain.train.torch import prepare_data_loader, prepare_model
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + 0.1
    loader = prepare_data_loader(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True))
    model = prepare_model(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05))
    start = 0
    ck = train.get_checkpoint()
    if ck:
        with ck.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"))
        model.module.load_state_dict(state["model"]) if hasattr(model, "module") else model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        gate = config.get("gate")
        if gate and epoch >= 2:  # the test opens it once it has seen what it waits for
            deadline = time.monotonic() + 300
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        loader.sampler.set_epoch(epoch)
        model.train()
        total = 0.0
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb).squeeze(-1), yb)
            loss.backward()
            opt.step()
            total += loss.item()
            time.sleep(config.get("step_sleep", 0))
        with tempfile.TemporaryDirectory() as d:
            inner = model.module if hasattr(model, "module") else model
            torch.save({"model": inner.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, os.path.join(d, "state.pt"))
            train.report({"loss": total / len(loader), "epoch": epoch, "world": train.get_context().get_world_size()},
                         checkpoint=train.Checkpoint.from_directory(d))


def test_fit_returns_its_metrics_and_a_checkpoint_that_opens(cluster):
    t = TorchTrainer(linear_loop, train_loop_config={"epochs": 3}, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="fit-basic", checkpoint_config=CheckpointConfig(num_to_keep=2)))
    r = t.fit()
    assert r.state == "completed"
    assert r.metrics["training_iteration"] == 3 and r.metrics["epoch"] == 2 and r.metrics["world"] == 2
    assert [m["epoch"] for m in r.metrics_history] == [0, 1, 2]
    assert r.metrics_history[-1]["loss"] < r.metrics_history[0]["loss"]
    assert r.checkpoint is not None and r.failures == 0
    with r.checkpoint.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"))
    assert state["epoch"] == 2
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(state["model"])
    assert torch.allclose(model.weight.detach(), torch.tensor([[1.0, -2.0, 3.0, 0.5]]), atol=0.3), model.weight


def test_fit_again_with_the_same_name_returns_the_ended_run(cluster):
    """A second fit() of a name that ran already attaches to its result: no second run."""
    r = TorchTrainer(linear_loop, train_loop_config={"epochs": 3}, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="fit-basic")).fit()
    assert r.metrics["training_iteration"] == 3 and r.checkpoint.id.startswith("ckpt-e000003")


def test_a_rank_killed_mid_fit_costs_at_most_the_steps_since_its_checkpoint(cluster):
    name = "fit-rank-killed"
    t = TorchTrainer(linear_loop, train_loop_config={"epochs": 6, "step_sleep": 0.05}, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name=name, failure_config=FailureConfig(max_failures=2)))
    import threading
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", t.fit()))
    th.start()
    client = cluster.client()
    h = client.get_workflow_handle(name)

    def progress():
        try:
            return cluster.loop.run(h.query("progress"))
        except Exception:
            return None
    p = wait_for("2 iterations", lambda: (lambda p: p if p and p.get("epoch", 0) >= 2 else None)(progress()))
    latest = p["latest_checkpoint"]["epoch"]
    pids = wait_for("the rank processes", lambda: rank_pids("TORCHELASTIC_RUN_ID=" + name))
    os.kill(pids[-1], signal.SIGKILL)
    th.join(180)
    r = out["r"]
    assert r.state == "completed" and r.failures >= 1, r.progress
    assert any(i["kind"] != "restored" for i in r.incidents), r.incidents
    restored = [i for i in r.incidents if i["kind"] == "restored"]
    assert restored, r.incidents
    # It resumed at a checkpoint no older than the newest when the rank was killed.
    import re
    at = re.search(r" at epoch (\d+) step", restored[-1]["detail"])
    assert at and int(at.group(1)) >= latest, (latest, restored[-1]["detail"])
    assert r.metrics["training_iteration"] == 6 and r.metrics["epoch"] == 5
    epochs = [m["epoch"] for m in r.metrics_history]
    assert epochs == sorted(epochs) and epochs[-1] == 5 and set(epochs) == set(range(6)), epochs


DRIVER = textwrap.dedent('''
    import sys
    sys.path.insert(0, {tests!r})
    from test_fit import linear_loop
    from durabletrain.train import RunConfig, ScalingConfig
    from durabletrain.train.torch import TorchTrainer
    r = TorchTrainer(linear_loop, train_loop_config={{"epochs": 8, "step_sleep": 0.03, "gate": {gate!r}}}, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name={name!r})).fit()
    print("RESULT", r.state, r.metrics["training_iteration"], r.checkpoint.id, flush=True)
''')


def test_a_driver_killed_mid_fit_and_run_again_attaches_to_its_run(cluster, tmp_path):
    name = "fit-driver-killed"
    script = tmp_path / "driver.py"
    # The run waits at epoch 2 until the second driver has attached, however
    # slowly a loaded machine starts it: it cannot end in between.
    gate = tmp_path / "attached"
    script.write_text(DRIVER.format(tests=os.path.dirname(__file__), name=name, gate=str(gate)))
    env = dict(os.environ)
    first = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = cluster.client()
    h = client.get_workflow_handle(name)

    def epoch():
        try:
            return cluster.loop.run(h.query("progress")).get("epoch", 0)
        except Exception:
            return 0
    wait_for("the first driver's run to train", lambda: epoch() >= 1)
    first.kill()
    first.wait()
    assert epoch() < 8, "the run ended before the driver was killed: nothing tested"
    second = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = []
    reader = threading.Thread(target=lambda: said.extend(second.stderr), daemon=True)
    reader.start()
    attached = "attached to the running run " + name
    wait_for("the second driver to attach", lambda: any(attached in l for l in said) or second.poll() is not None, timeout=240)
    gate.touch()
    out = second.stdout.read()
    assert second.wait(240) == 0, out + "".join(said)
    reader.join(10)
    assert any(attached in l for l in said), "".join(said)
    line = [l for l in out.splitlines() if l.startswith("RESULT")][0]
    assert line.split()[1:3] == ["completed", "8"], line
    # One run, started once: the history has one execution of that ID.
    runs = cluster.loop.run(_executions(client, name))
    assert len(runs) == 1, runs


async def _executions(client, wid):
    return [w async for w in client.list_workflows('WorkflowId = "%s"' % wid)]


def index_loop(config):
    """Trains on a data set of indices, recording which ones rank 0 trained,
    with a checkpoint inside the loop every config["every"] steps."""
    import json, os, tempfile, time
    import torch
    from durabletrain import train
    from durabletrain.train.torch import prepare_data_loader, prepare_model
    ds = torch.utils.data.TensorDataset(torch.arange(config["n"]))
    loader = prepare_data_loader(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True))
    model = prepare_model(torch.nn.Linear(1, 1))
    seen, start, done = [], 0, True
    ck = train.get_checkpoint()
    if ck:
        with ck.as_directory() as d:
            st = json.load(open(os.path.join(d, "seen.json")))
        seen, start, done = st["seen"], st["epoch"], st["done"]
        if done:
            start += 1
    for epoch in range(start, config["epochs"]):
        loader.sampler.set_epoch(epoch)
        model.train()
        for i, (xb,) in enumerate(loader):
            seen.append([epoch] + xb.tolist())
            time.sleep(config["sleep"])
            if (len([s for s in seen if s[0] == epoch])) % config["every"] == 0:
                with tempfile.TemporaryDirectory() as d:
                    json.dump({"seen": seen, "epoch": epoch, "done": False}, open(os.path.join(d, "seen.json"), "w"))
                    train.report({"steps": len(seen)}, checkpoint=train.Checkpoint.from_directory(d))
        with tempfile.TemporaryDirectory() as d:
            json.dump({"seen": seen, "epoch": epoch, "done": True}, open(os.path.join(d, "seen.json"), "w"))
            train.report({"steps": len(seen), "epoch": epoch}, checkpoint=train.Checkpoint.from_directory(d))


def test_prepare_data_loader_resumes_mid_epoch_on_the_samples_not_trained(cluster):
    """A rank SIGKILLed mid-epoch: the run resumes at the step of its newest
    checkpoint, inside the epoch, and the prepared loader gives exactly the
    samples after it, in DistributedSampler's order: over the whole run rank
    0 trains each sample of its shard once per epoch, none twice."""
    import json
    from torch.utils.data.distributed import DistributedSampler
    name = "fit-mid-epoch"
    n, epochs = 96, 3
    t = TorchTrainer(index_loop, train_loop_config={"n": n, "epochs": epochs, "every": 3, "sleep": 0.1},
                     scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(name=name))
    import threading
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", t.fit()))
    th.start()
    h = cluster.client().get_workflow_handle(name)

    def mid_epoch():
        d = os.path.join(cluster.storage, name)
        ids = os.listdir(d) if os.path.isdir(d) else []
        return [i for i in ids if i.startswith("ckpt-e000001-s") and not i.endswith("s000000000") and i != "ckpt-e000001-s000000012"]
    wait_for("a checkpoint inside epoch 1", mid_epoch, every=0.02)
    os.kill(rank_pids("TORCHELASTIC_RUN_ID=" + name)[-1], signal.SIGKILL)
    th.join(180)
    r = out["r"]
    assert r.state == "completed" and r.failures == 1, r.progress
    restored = [i for i in r.incidents if i["kind"] == "restored"]
    assert restored and "step 0" not in restored[-1]["detail"].split(" at ")[1], restored
    with r.checkpoint.as_directory() as d:
        seen = json.load(open(os.path.join(d, "seen.json")))["seen"]
    ds = torch.utils.data.TensorDataset(torch.arange(n))
    want = []
    for e in range(epochs):
        s = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True)
        s.set_epoch(e)
        order = list(s)
        want += [[e] + order[i:i + 4] for i in range(0, len(order), 4)]
    assert seen == want, "rank 0 trained %s; a run never stopped trains %s" % (seen, want)


def test_a_rank_stopped_mid_epoch_is_found_by_its_keepalives_and_the_run_goes_on(cluster):
    """A rank SIGSTOPped mid-epoch (a hang it cannot get out of: blocked in
    the kernel, a deadlock) sends no keepalive: its worker kills it once the
    stall timeout passes, the gang re-forms, resumes at its newest step
    checkpoint and completes, with the failure counted and saying why.
    (Before, the run waited on the stopped rank for ever.)"""
    name = "fit-stopped-rank"
    t = TorchTrainer(index_loop, train_loop_config={"n": 96, "epochs": 2, "every": 3, "sleep": 0.1},
                     scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(name=name))
    r, _, stopped = fit_with_a_rank_signalled(cluster, t, name, "ckpt-e000001-s", sig=signal.SIGSTOP, timeout=180)
    said = " ".join(i.get("detail", "") for i in r.incidents)
    assert "keepalive" in said and "stall_timeout" in said, r.incidents
    assert not os.path.exists("/proc/%d" % stopped) or open("/proc/%d/stat" % stopped).read().split()[2] == "Z", "the stopped rank was not killed"


def spare_loop(config):
    """Iterations that say whether the process that trained them started as
    a worker's spare, with a checkpoint at each."""
    import os, tempfile, time
    from durabletrain import train
    from durabletrain.train.torch import prepare_model
    import torch
    prepare_model(torch.nn.Linear(1, 1))
    with open("/proc/self/cmdline", "rb") as f:
        spare = 1.0 if b"durabletrain._spare" in f.read() else 0.0
    ck = train.get_checkpoint()
    start = ck.epoch if ck else 0
    for i in range(start, config["n"]):
        time.sleep(0.5)
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "it"), "w").write(str(i))
            train.report({"it": i, "spare": spare}, checkpoint=train.Checkpoint.from_directory(d))


def test_warm_spares_take_a_killed_gangs_place_with_pytorch_imported(cluster):
    """FailureConfig(warm_spares=True): a rank SIGKILLed mid-run, the new
    gang's ranks are the spares their first start left on the worker (their
    interpreter up and PyTorch imported), and the run completes."""
    name = "fit-warm-spares"
    t = TorchTrainer(spare_loop, train_loop_config={"n": 42}, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name=name, failure_config=FailureConfig(warm_spares=True)))
    # Spares start 15 s after their ranks (exectrainer's spareDelay): the kill comes after 18 s of iterations.
    r, _, _ = fit_with_a_rank_signalled(cluster, t, name, "ckpt-e000036-s", least_step=0)
    rows = r.metrics_dataframe.to_dict("records")
    before = [row["spare"] for row in rows if row["it"] <= 1]
    assert before and set(before) == {0.0}, rows
    assert rows[-1]["spare"] == 1.0, rows


def failing_loop(config):
    import os, tempfile
    from durabletrain import train
    for i in range(5):
        if i == 2:
            raise ValueError("the data at iteration 2 is bad")
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "i"), "w").write(str(i))
            train.report({"i": i}, checkpoint=train.Checkpoint.from_directory(d))


def test_a_function_that_raises_fails_the_run_with_its_error_and_keeps_its_checkpoints(cluster):
    from durabletrain.train import TrainingFailedError
    t = TorchTrainer(failing_loop, scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(name="fit-raises"))
    with pytest.raises(TrainingFailedError) as e:
        t.fit()
    assert "ValueError: the data at iteration 2 is bad" in str(e.value), str(e.value)
    r = e.value.result
    assert r.state == "failed" and r.failures == 0, r.progress  # the user's error: not retried, not charged
    assert r.metrics["i"] == 1 and r.checkpoint is not None
    with r.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "i")).read() == "1"


def test_a_function_trainable_tuned_as_ray_tunes_it(cluster):
    """Ray's function API: Tuner(fn, param_space={...}) with the config at the top level, tune.report."""
    from durabletrain import tune

    def objective(config):
        for step in range(3):
            tune.report({"score": config["a"] * (step + 1) + config["b"]})
    grid = tune.Tuner(objective, param_space={"a": tune.grid_search([1, 2, 3]), "b": 10},
                      tune_config=tune.TuneConfig(metric="score", mode="max"), run_config=RunConfig(name="tune-function")).fit()
    assert len(grid) == 3 and grid.num_errors == 0 and grid.num_terminated == 3
    best = grid.get_best_result()
    assert best.config == {"a": 3} or best.config.get("a") == 3, best
    assert best.metrics["score"] == 19 and best.metrics["training_iteration"] == 3, best.metrics


def test_named_code_and_a_working_dir_reach_the_ranks(cluster, tmp_path):
    """TorchTrainer("module:function") runs code from the working_dir the
    driver uploaded (Ray's runtime_env working_dir): each rank unpacks it,
    checked against its hash, as its working directory; train_loop_config
    reaches it as the run's config."""
    wd = tmp_path / "code"
    (wd / "pkg").mkdir(parents=True)
    (wd / "pkg" / "__init__.py").write_text("")
    (wd / "pkg" / "job.py").write_text(textwrap.dedent('''
        import os
        from durabletrain import train
        def loop(config):
            words = open("words.txt").read().split()
            for i in range(config["n"]):
                train.report({"words": len(words), "i": i, "rank": train.get_context().get_world_rank()})
    '''))
    (wd / "words.txt").write_text("one two three")
    r = TorchTrainer("pkg.job:loop", train_loop_config={"n": 2}, working_dir=str(wd), scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="fit-named-code")).fit()
    assert r.metrics["words"] == 3 and r.metrics["training_iteration"] == 2, r.metrics


def test_a_working_dir_unpacks_for_a_function_shipped_by_value(cluster, tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "table.csv").write_text("a,b\n1,2\n")

    def loop():
        from durabletrain import train
        train.report({"lines": len(open("table.csv").read().splitlines())})
    r = TorchTrainer(loop, working_dir=str(wd), run_config=RunConfig(name="fit-working-dir")).fit()
    assert r.metrics["lines"] == 2
