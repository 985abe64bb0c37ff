"""``python -m durabletrain._spare``: a spare rank process, started by a
worker ahead of need (``exec.warm_spare``; Go's trainer/exectrainer/spare.go).

It imports what a rank's start spends its time on (PyTorch, and the modules
``DURABLETRAIN_PRELOAD`` names, comma-separated), then waits for one line on
standard input: the rank's whole environment and working directory, as
JSON. It takes them and runs ``durabletrain._rank`` as ``python -m`` would,
so the rank starts with its interpreter up and PyTorch imported. Standard
input closed without a line: not needed, it exits.
"""

import importlib
import json
import os
import runpy
import sys


def _preload() -> None:
    for name in ["torch"] + [n for n in os.environ.get("DURABLETRAIN_PRELOAD", "").split(",") if n]:
        try:
            importlib.import_module(name)
        except Exception:  # not installed here: the rank imports what it needs itself
            pass


def main() -> None:
    started_in = os.getcwd()  # python -m put it first on sys.path
    _preload()
    line = sys.stdin.readline()
    if not line:
        return
    msg = json.loads(line)
    env = dict(e.split("=", 1) for e in msg["env"] if "=" in e)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(msg["dir"])
    # sys.path as `python -m` would have made it in the rank's directory
    # (PYTHONPATH is the same: it is part of the spare's key).
    if sys.path and sys.path[0] in (started_in, ""):
        sys.path[0] = os.getcwd()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    sys.argv = ["-m"]
    runpy.run_module("durabletrain._rank", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
