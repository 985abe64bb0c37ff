"""The reference program (shared/reference/000), ported by changing its
imports only, runs on durabletrain as written: the function defined at the
top level of the script, trainer.fit() unguarded at module level."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from conftest import REPO, fashion_mnist_root  # noqa: E402

EXAMPLE = os.path.join(REPO, "examples", "ray_to_durabletrain", "durabletrain_resnet18.py")


def test_the_ported_reference_script_trains_two_cpu_ranks(cluster, tmp_path):
    fashion_mnist_root(tmp_path / "data", train=256, test=128)
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, NUM_WORKERS="2", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, EXAMPLE], cwd=str(run), env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    client = cluster.client()
    p = cluster.loop.run(client.get_workflow_handle("exp_fashionmnist_resnet18").query("progress"))
    assert p["state"] == "completed", p
    metrics = p["metrics"]
    assert [m["other"]["epoch"] for m in metrics] == list(range(10)), metrics
    assert all(0.0 <= m["other"]["acc"] <= 1.0 for m in metrics)
    # Its last checkpoint opens: the DDP model's state dict, as the script saved it.
    from durabletrain._driver import result_of
    ref = p["latest_checkpoint"]
    assert ref["url"].startswith("file://" + str(tmp_path / "data" / "torch_ckpt")), ref
    from durabletrain.train import Checkpoint
    ck = Checkpoint(url=ref["url"], run=ref["run"], id=ref["id"])
    with ck.as_directory() as d:
        state = torch.load(os.path.join(d, "model.pt"))
    from torchvision.models import resnet18
    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    model.load_state_dict({k[len("module."):]: v for k, v in state.items()})
