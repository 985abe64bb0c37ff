"""Ray Train's framework guides (PyTorch Lightning, Hugging Face Transformers,
XGBoost), each ported by changing its imports only: the diff against the Ray
version is at most three import lines, and the ported script runs as written,
as a script, against a real local cluster (its metrics and checkpoint are the
run's, and load with the framework's own loader)."""

import difflib
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, fashion_mnist_root

EXAMPLES = os.path.join(REPO, "examples", "ray_to_durabletrain")

# (Ray's version, durabletrain's, the most lines the port may change)
PAIRS = [
    ("ray_train_resnet18.py", "durabletrain_resnet18.py", 3),
    ("ray_tune_mnist.py", "durabletrain_tune_mnist.py", 4),
    ("ray_lightning_fashion_mnist.py", "durabletrain_lightning_fashion_mnist.py", 3),
    ("ray_transformers_reviews.py", "durabletrain_transformers_reviews.py", 3),
    ("ray_xgboost_classifier.py", "durabletrain_xgboost_classifier.py", 3),
]


def changed(ray_file, ours):
    a = open(os.path.join(EXAMPLES, ray_file)).read().splitlines()
    b = open(os.path.join(EXAMPLES, ours)).read().splitlines()
    removed, added = [], []
    for line in difflib.unified_diff(a, b, lineterm="", n=0):
        if line.startswith(("---", "+++", "@@")):
            continue
        (removed if line.startswith("-") else added).append(line[1:])
    return removed, added


@pytest.mark.parametrize("ray_file,ours,most", PAIRS, ids=[p[1] for p in PAIRS])
def test_a_port_changes_only_its_imports(ray_file, ours, most):
    removed, added = changed(ray_file, ours)
    assert removed and len(removed) <= most and len(added) <= most, (removed, added)
    assert all(re.match(r"(import ray\b|from ray[. ])", line) for line in removed), removed
    assert all(re.match(r"(import durabletrain\b|from durabletrain[. ])", line) for line in added), added


def run_script(name, cwd, **env):
    e = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", NUM_WORKERS="2", **env)
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], cwd=str(cwd), env=e,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    return out.stdout


def progress(cluster, run):
    client = cluster.client()
    p = cluster.loop.run(client.get_workflow_handle(run).query("progress"))
    assert p["state"] == "completed" and p.get("failures", 0) == 0, p
    return p


def test_the_ported_lightning_guide_trains_and_loads_its_checkpoint(cluster, tmp_path):
    pytest.importorskip("lightning")
    pytest.importorskip("torchvision")
    data = fashion_mnist_root(tmp_path / "data", train=256, test=128)
    out = run_script("durabletrain_lightning_fashion_mnist.py", tmp_path, DATA_DIR=data, EPOCHS="2")
    acc = float(re.search(r"^val_accuracy (\S+)$", out, re.M).group(1))
    assert 0.0 <= acc <= 1.0, out
    p = progress(cluster, "lightning_fashion_mnist")
    assert [m["epoch"] for m in p["metrics"]] == [0, 1], p["metrics"]
    assert {"loss", "val_loss", "val_accuracy"} <= set(p["metrics"][-1]["other"]), p["metrics"][-1]


def test_the_ported_transformers_guide_trains_and_loads_its_checkpoint(cluster, tmp_path):
    pytest.importorskip("transformers")
    out = run_script("durabletrain_transformers_reviews.py", tmp_path, EPOCHS="2")
    acc = float(re.search(r"^eval_accuracy (\S+)$", out, re.M).group(1))
    assert 0.0 <= acc <= 1.0, out
    p = progress(cluster, "transformers_reviews")
    assert len(p["metrics"]) == 2, p["metrics"]
    # A relative output_dir is each rank's own, never the working directory the script ran in.
    assert not os.path.exists(tmp_path / "test_trainer") or os.listdir(tmp_path / "test_trainer") == []


def test_the_ported_xgboost_guide_boosts_and_loads_its_model(cluster, tmp_path):
    pytest.importorskip("xgboost")
    out = run_script("durabletrain_xgboost_classifier.py", tmp_path, ROUNDS="12")
    m = re.search(r"^rounds (\d+) validation-error (\S+)$", out, re.M)
    assert m and int(m.group(1)) == 12, out
    # The generated labels follow five features: boosting learns them (a coin would be 0.5).
    assert float(m.group(2)) < 0.3, out
    progress(cluster, "xgboost_classifier")


def test_the_diffs_in_the_guide_are_the_examples_diffs():
    """Every ```diff block of docs/training.md that opens with `$ diff A B` shows
    what diff prints for those two files today."""
    guide = open(os.path.join(REPO, "docs", "training.md")).read()
    blocks = re.findall(r"```diff\n\$ diff (\S+) (\S+)\n(.*?)```", guide, re.S)
    assert len(blocks) >= 4, blocks
    for a, b, shown in blocks:
        out = subprocess.run(["diff", a, b], cwd=REPO, capture_output=True, text=True)
        assert out.returncode == 1 and out.stdout == shown, (a, b, out.stdout, shown)
