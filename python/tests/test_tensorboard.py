"""The event files a run writes, read by the real TensorBoard package (its
EventAccumulator, what `tensorboard --logdir` serves) and checked against the
run's reported metrics: every scalar, by count, step and value, for a run that
went straight through and for one resumed in the middle of an epoch."""

import os
import signal

import pytest

pytest.importorskip("torch")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
np = pytest.importorskip("numpy")

from durabletrain.train import RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.torch import TorchTrainer  # noqa: E402

from conftest import fit_with_a_rank_signalled  # noqa: E402
from test_fit import index_loop, linear_loop  # noqa: E402


def logdir_of(result):
    """The local directory of a run's event files (Result.path is its URL)."""
    from urllib.parse import unquote, urlparse
    u = urlparse(result.path)
    assert u.scheme == "file", result.path
    return os.path.join(unquote(u.path), "tensorboard")


def scalars(logdir):
    """Every scalar TensorBoard reads in logdir: tag -> [(step, value)], in
    the order it serves them. TensorBoard's loader skips a damaged record
    without a word, so the files are also checked to be whole."""
    files = sorted(f for f in os.listdir(logdir) if "tfevents" in f)
    assert files, "no event files in %s" % logdir
    for f in files:
        # A whole file is nothing but records: TensorBoard's own reader gets to its end.
        from tensorboard.backend.event_processing import event_file_loader
        n = sum(1 for _ in event_file_loader.EventFileLoader(os.path.join(logdir, f)).Load())
        assert n >= 2, "%s holds %d records" % (f, n)
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def check_against_history(tb, history):
    """Each metric the run reported is a tag holding one event per iteration
    that reported it, at increasing steps, none twice, none missing, with
    the reported value (as float32, TensorBoard's simple_value)."""
    keys = {k for row in history for k in row if k != "training_iteration"}
    assert keys <= set(tb), "reported %s; TensorBoard has %s" % (sorted(keys), sorted(tb))
    for k in keys:
        want = [np.float32(row[k]) for row in history if k in row]
        got = tb[k]
        steps = [s for s, _ in got]
        assert steps == sorted(set(steps)), "%s: steps %s (a step written twice or out of order)" % (k, steps)
        assert [v for _, v in got] == want, "%s: TensorBoard has %s; the run reported %s" % (k, got, want)


def test_tensorboard_reads_every_reported_metric_of_a_run(cluster):
    r = TorchTrainer(linear_loop, train_loop_config={"epochs": 4}, scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(name="tb-straight")).fit()
    assert r.state == "completed"
    tb = scalars(logdir_of(r))
    check_against_history(tb, r.metrics_history)
    assert len(r.metrics_history) == 4 and len(tb["loss"]) == 4, tb
    # The program reports no loss per step: TensorBoard shows no made-up one.
    assert set(tb) == {"loss", "epoch", "world"}, sorted(tb)


def test_tensorboard_has_each_step_once_after_a_resume_mid_epoch(cluster):
    """A rank SIGKILLed inside an epoch, the run resumed at a step checkpoint
    inside it: TensorBoard still has every iteration's metrics once."""
    name = "tb-resumed"
    t = TorchTrainer(index_loop, train_loop_config={"n": 96, "epochs": 3, "every": 3, "sleep": 0.1},
                     scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(name=name))
    r, detail, _ = fit_with_a_rank_signalled(cluster, t, name, "ckpt-e000001-s", least_step=4)
    assert "step 0" not in detail.split(" at ")[1], detail
    tb = scalars(logdir_of(r))
    check_against_history(tb, r.metrics_history)
    assert [row["epoch"] for row in r.metrics_history] == [0, 1, 2], r.metrics_history
