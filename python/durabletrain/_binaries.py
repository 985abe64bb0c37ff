"""Where the Go binaries the Python side runs are: starter (spec checks,
checkpoint reads), worker and devserver (durabletrain.init()'s local cluster).

In order: $DURABLETRAIN_BIN_DIR; bin/ of the source tree this package sits
in (a clone: ``make`` builds them there); a cache built from that source
tree with Go (``~/.cache/durabletrain/<version>/``); $PATH. A machine
without Go needs the three binaries, from a release or another machine,
in $DURABLETRAIN_BIN_DIR.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from typing import Optional

NAMES = ("starter", "worker", "devserver")
_lock = threading.Lock()


def source_tree() -> Optional[str]:
    """The repository this package was installed from (editable), if any."""
    env = os.environ.get("DURABLETRAIN_SOURCE")
    candidates = [env] if env else []
    candidates.append(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
    recorded = os.path.join(os.path.dirname(__file__), "_source.txt")  # written by setup.py when built from a clone
    if os.path.isfile(recorded):
        with open(recorded) as f:
            candidates.append(f.read().strip())
    for c in candidates:
        if c and os.path.isfile(os.path.join(c, "go.mod")) and os.path.isdir(os.path.join(c, "cmd", "worker")):
            return c
    return None


def _cache_dir() -> str:
    from durabletrain import __version__
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "durabletrain", __version__)


def find(name: str, build: bool = True) -> str:
    """The path of binary name, built from the source tree if need be."""
    if name not in NAMES:
        raise ValueError("durabletrain: no binary %r; want one of %s" % (name, ", ".join(NAMES)))
    env = os.environ.get("DURABLETRAIN_BIN_DIR")
    if env:
        p = os.path.join(env, name)
        if os.access(p, os.X_OK):
            return p
        raise FileNotFoundError("durabletrain: DURABLETRAIN_BIN_DIR is %s, which has no executable %s" % (env, name))
    src = source_tree()
    if src:
        p = os.path.join(src, "bin", name)
        if os.access(p, os.X_OK):
            return p
    with _lock:
        p = os.path.join(_cache_dir(), name)
        if os.access(p, os.X_OK):
            return p
        onpath = shutil.which("durabletrain-" + name) or (shutil.which(name) if name == "starter" else None)
        if onpath:
            return onpath
        if not build or not src or not shutil.which("go"):
            raise FileNotFoundError(
                "durabletrain: no %s binary: set DURABLETRAIN_BIN_DIR to a directory holding starter, worker and devserver, "
                "or install this package from a clone of the repository on a machine with Go (it builds them)" % name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        note = " (the dev server links Temporal's: minutes, once)" if name == "devserver" else ""
        print("durabletrain: building %s from %s%s" % (name, src, note), file=sys.stderr, flush=True)
        tmp = p + ".tmp%d" % os.getpid()
        out = subprocess.run(["go", "build", "-o", tmp, "./cmd/" + name], cwd=src, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError("durabletrain: go build ./cmd/%s failed:\n%s" % (name, out.stderr[-4000:]))
        os.replace(tmp, p)
        return p
