"""The Python front door's tests run against a real local cluster: the
embedded Temporal dev server and real worker processes (bin/ of the
repository, which `make test` builds; built here with Go if missing)."""

import os
import signal
import json
import time

import pytest


@pytest.fixture(scope="session")
def home(tmp_path_factory):
    d = tmp_path_factory.mktemp("durabletrain-home")
    os.environ["DURABLETRAIN_HOME"] = str(d)
    return d


@pytest.fixture(scope="session")
def cluster(home, tmp_path_factory):
    import durabletrain
    from durabletrain import _cluster
    storage = tmp_path_factory.mktemp("storage")
    c = durabletrain.init(num_cpus=3, storage=str(storage))
    yield c
    durabletrain.shutdown()
    # A driver killed by a test may have left a cluster it started.
    try:
        st = json.load(open(os.path.join(str(home), "cluster.json")))
        for pid in st.get("pids", []):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    except (OSError, ValueError):
        pass


def rank_pids(marker):
    """The rank processes whose environment holds marker (a run's function path)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"durabletrain._rank" in cmd and marker.encode() in env:
            out.append(int(pid))
    return sorted(out)


def wait_for(what, check, timeout=120, every=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = check()
        if v:
            return v
        time.sleep(every)
    raise AssertionError("timed out waiting for " + what)


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SUBSET = os.path.join(REPO, "testdata", "fashion-mnist-small")


def fashion_mnist_root(root, train=512, test=256):
    """A torchvision FashionMNIST root (root/FashionMNIST/raw/*-ubyte) holding
    the first train and test images of the committed subset, so that
    download=True finds them and downloads nothing."""
    import gzip
    import struct
    raw = os.path.join(str(root), "FashionMNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name, n in (("train-images-idx3-ubyte", train), ("train-labels-idx1-ubyte", train),
                    ("t10k-images-idx3-ubyte", test), ("t10k-labels-idx1-ubyte", test)):
        with gzip.open(os.path.join(SUBSET, name + ".gz"), "rb") as f:
            data = f.read()
        magic, count = struct.unpack(">II", data[:8])
        dims = 3 if "images" in name else 1
        header = 4 * (1 + dims)
        shape = struct.unpack(">" + "I" * dims, data[4:header])
        item = 1
        for d in shape[1:]:
            item *= d
        n = min(n, count)
        out = data[:4] + struct.pack(">I", n) + data[8:header] + data[header:header + n * item]
        with open(os.path.join(raw, name), "wb") as f:
            f.write(out)
    return str(root)


def stop_the_worker_of(cluster, name, replacement):
    """SIGTERMs the worker whose ranks train run name (the cluster's worker
    also runs workflows, so one that replaces it, replacement, starts first)."""
    ranks = rank_pids("TORCHELASTIC_RUN_ID=" + name)
    with open("/proc/%d/stat" % ranks[0]) as f:
        worker = int(f.read().rsplit(")", 1)[1].split()[1])
    cluster._start_worker(3, "both", replacement)
    cluster.slots -= 3
    os.kill(worker, signal.SIGTERM)


def checkpoints_after(cluster, name, prefix, least_step=1):
    """The run's checkpoints named prefix..., at least_step or later."""
    d = os.path.join(cluster.storage, name)
    ids = os.listdir(d) if os.path.isdir(d) else []
    return [i for i in ids if i.startswith(prefix) and int(i[-9:]) >= least_step]


def fit_with_a_rank_signalled(cluster, trainer, name, prefix, least_step=1, sig=signal.SIGKILL, timeout=300):
    """Fits trainer (its run named name) in a thread; once the run holds a
    checkpoint named prefix... at least_step or later, sends sig to the run's
    last rank process. Returns the Result, the newest restored incident's
    detail and the signalled process, after checking that the run completed
    with that one failure."""
    import threading
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", trainer.fit()))
    th.start()
    wait_for("a checkpoint %s... at step %d or later" % (prefix, least_step), lambda: checkpoints_after(cluster, name, prefix, least_step), every=0.02)
    victim = rank_pids("TORCHELASTIC_RUN_ID=" + name)[-1]
    os.kill(victim, sig)
    th.join(timeout)
    assert not th.is_alive(), "the run %s is still going %d s after its rank %d had signal %d" % (name, timeout, victim, sig)
    r = out["r"]
    assert r.state == "completed" and r.failures == 1, r.progress
    restored = [i for i in r.incidents if i["kind"] == "restored"]
    assert restored, r.incidents
    return r, restored[-1]["detail"], victim
