"""A TorchTrainer function named by module:function (DTPY_FUNCTION), for
spare_test.go: each iteration reports which process trained it, whether
that process started as a spare, and what its environment says."""
import os

from durabletrain import train


def loop(config):
    with open("/proc/self/cmdline", "rb") as f:
        spare = b"durabletrain._spare" in f.read()
    for _ in range(3):
        train.report({"pid": os.getpid(), "spare": 1.0 if spare else 0.0, "rank": float(os.environ["RANK"]),
                      "in_dir": 1.0 if os.getcwd() == os.environ["WANT_DIR"] else 0.0,
                      "scratch_ok": 1.0 if os.path.isdir(os.environ["DURABLETRAIN_SCRATCH_DIR"]) else 0.0})
