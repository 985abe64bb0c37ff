"""Malformed configs are refused in Python, naming the field, before anything starts."""

import os

import pytest

from durabletrain.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from durabletrain import tune


@pytest.mark.parametrize("make, field", [
    (lambda: ScalingConfig(num_workers=0), "ScalingConfig.num_workers"),
    (lambda: ScalingConfig(num_workers=10 ** 6), "ScalingConfig.num_workers"),
    (lambda: ScalingConfig(num_workers="2"), "ScalingConfig.num_workers"),
    (lambda: ScalingConfig(num_workers=True), "ScalingConfig.num_workers"),
    (lambda: ScalingConfig(use_gpu="yes"), "ScalingConfig.use_gpu"),
    (lambda: ScalingConfig(num_workers=2, min_workers=3), "ScalingConfig.min_workers"),
    (lambda: ScalingConfig(resources_per_worker={"TPU": 1}), "ScalingConfig.resources_per_worker"),
    (lambda: ScalingConfig(resources_per_worker={"GPU": 0.5}), "ScalingConfig.resources_per_worker"),
    (lambda: ScalingConfig(gang_timeout_s=-1), "ScalingConfig.gang_timeout_s"),
    (lambda: CheckpointConfig(num_to_keep=0), "CheckpointConfig.num_to_keep"),
    (lambda: CheckpointConfig(checkpoint_score_order="best"), "CheckpointConfig.checkpoint_score_order"),
    (lambda: CheckpointConfig(checkpoint_score_attribute=""), "CheckpointConfig.checkpoint_score_attribute"),
    (lambda: FailureConfig(max_failures=-2), "FailureConfig.max_failures"),
    (lambda: FailureConfig(heartbeat_timeout_s=float("nan")), "FailureConfig.heartbeat_timeout_s"),
    (lambda: RunConfig(name="a/b"), "RunConfig.name"),
    (lambda: RunConfig(name=""), "RunConfig.name"),
    (lambda: RunConfig(stop={"accuracy": 0.9}), "RunConfig.stop"),
    (lambda: RunConfig(stop={"training_iteration": 0}), "RunConfig.stop"),
    (lambda: RunConfig(checkpoint_config={"num_to_keep": 2}), "RunConfig.checkpoint_config"),
    (lambda: tune.TuneConfig(num_samples=0), "TuneConfig.num_samples"),
    (lambda: tune.TuneConfig(mode="maximise"), "TuneConfig.mode"),
    (lambda: tune.TuneConfig(scheduler="asha"), "TuneConfig.scheduler"),
])
def test_a_malformed_config_names_its_field(make, field):
    with pytest.raises((ValueError, TypeError)) as e:
        make()
    assert field in str(e.value), str(e.value)
    assert "want" in str(e.value), str(e.value)


def test_ray_spellings_map_onto_the_spec():
    assert ScalingConfig(num_workers=4, resources_per_worker={"GPU": 2}).to_spec() == {"workers": 4, "gpus_per_worker": 2}
    assert CheckpointConfig(num_to_keep=2).to_spec() == {"keep_last": 2}
    assert CheckpointConfig(num_to_keep=3, checkpoint_score_attribute="acc", checkpoint_score_order="max").to_spec() == {
        "keep_best": 3, "score": "acc", "mode": "max", "keep_last": 1}
    assert FailureConfig(max_failures=-1).max_failures == 10000  # Ray's "retry forever"
    assert FailureConfig(max_failures=0, heartbeat_timeout_s=3).to_spec() == {"max_failures": 0, "heartbeat_timeout": "3000ms"}
    assert RunConfig(stop={"training_iteration": 7}).max_iterations == 7


def test_the_go_side_refuses_what_python_cannot_see(cluster):
    """A spec Python's configs let through but the workflow would refuse is
    refused by the same words before anything starts (starter check)."""
    from durabletrain.train.torch import TorchTrainer

    def loop():
        pass
    name = "refused-before-start"
    t = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, workers_per_host=3), run_config=RunConfig(name=name))
    with pytest.raises(ValueError) as e:
        t.fit()
    assert "scaling.workers_per_host" in str(e.value), str(e.value)
    client = cluster.client()
    from temporalio.service import RPCError
    with pytest.raises(RPCError):
        cluster.loop.run(client.get_workflow_handle(name).describe())


def test_a_function_that_cannot_be_pickled_is_refused_before_start(cluster):
    import threading
    from durabletrain.train.torch import TorchTrainer
    lock = threading.Lock()

    def loop():
        with lock:
            pass
    with pytest.raises(TypeError) as e:
        TorchTrainer(loop, run_config=RunConfig(name="unpicklable")).fit()
    assert "cannot be pickled" in str(e.value)


def test_a_search_space_entry_is_a_domain_or_a_constant():
    from durabletrain.train.torch import TorchTrainer
    with pytest.raises(ValueError) as e:
        tune.Tuner(TorchTrainer(lambda: None), param_space={"train_loop_config": {"lr": lambda: 0.1}})
    assert "param_space['train_loop_config.lr']" in str(e.value) and "want a search-space entry" in str(e.value)
    with pytest.raises(ValueError) as e:
        tune.Tuner(TorchTrainer(lambda: None), param_space={"lr": tune.uniform(0, 1)})
    assert "train_loop_config" in str(e.value)
    t = tune.Tuner(TorchTrainer(lambda: None), param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1), "width": 64}})
    assert t.trainer._job.config == {"width": 64} and list(t.domains) == ["train_loop_config.lr"]


def test_a_rank_refuses_a_pickle_whose_hash_differs(tmp_path, monkeypatch):
    """A function file swapped in storage is never unpickled."""
    import hashlib, pickle
    from durabletrain import _rank
    evil = tmp_path / "f.pkl"
    evil.write_bytes(pickle.dumps({"function": print, "config": {}}))
    monkeypatch.setenv("DTPY_FUNCTION", str(evil))
    monkeypatch.setenv("DTPY_FUNCTION_SHA256", hashlib.sha256(b"what the driver wrote").hexdigest())
    with pytest.raises(SystemExit) as e:
        _rank._load()
    assert "refused, not loaded" in str(e.value)


def test_a_rank_refuses_a_working_dir_that_escapes(tmp_path, monkeypatch):
    import hashlib, io, tarfile
    from durabletrain import _rank
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    p = tmp_path / "wd.tar.gz"
    p.write_bytes(buf.getvalue())
    monkeypatch.setenv("DTPY_WORKING_DIR", str(p))
    monkeypatch.setenv("DTPY_WORKING_DIR_SHA256", hashlib.sha256(buf.getvalue()).hexdigest())
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    cwd = os.getcwd()
    try:
        with pytest.raises(SystemExit) as e:
            _rank._unpack_working_dir()
    finally:
        os.chdir(cwd)
    assert "not a file inside it" in str(e.value)
    assert not (tmp_path.parent / "escaped.txt").exists()


def test_auto_finds_no_cluster_in_an_empty_home(tmp_path, monkeypatch):
    """init(address="auto") joins a running cluster, as Ray's does, and says so when there is none."""
    from durabletrain import _cluster
    monkeypatch.setenv("DURABLETRAIN_HOME", str(tmp_path))
    monkeypatch.delenv("TEMPORAL_ADDRESS", raising=False)
    assert _cluster._running_local("default") is None
    saved, _cluster._cluster = _cluster._cluster, None
    try:
        with pytest.raises(ConnectionError) as e:
            _cluster.init("auto")
        assert "no cluster is running here" in str(e.value)
    finally:
        _cluster._cluster = saved


def test_optuna_search_takes_rays_arguments_and_refuses_what_it_cannot_do():
    """Ray's OptunaSearch, by its import path: Optuna's TPE with its defaults;
    what it cannot honour is refused before anything starts, naming it."""
    from durabletrain.tune.search.optuna import OptunaSearch
    s = OptunaSearch(metric="accuracy", mode="max", seed=7)
    assert (s.metric, s.mode, s.seed, s.to_spec()) == ("accuracy", "max", 7, {"type": "tpe", "n_startup_trials": 10})
    for kwargs, named in (({"space": {"lr": [0, 1]}}, "space"), ({"points_to_evaluate": [{"lr": 0.1}]}, "points_to_evaluate"),
                          ({"mode": "best"}, "mode"), ({"seed": -1}, "seed"), ({"sampler": object()}, "sampler"),
                          ({"max_concurrent": 2}, "max_concurrent")):
        with pytest.raises(ValueError, match=named):
            OptunaSearch(**kwargs)
