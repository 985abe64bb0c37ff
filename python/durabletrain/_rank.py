"""``python -m durabletrain._rank``: one rank of a TorchTrainer's run.

The driver pickled the training function by value (cloudpickle, as Ray
ships it) into the run's storage; the worker starts this module once per
rank with the file's path and SHA-256 in DTPY_FUNCTION and
DTPY_FUNCTION_SHA256. A file whose hash differs is refused, never
unpickled. DTPY_FUNCTION may also name importable code,
``module:function``, already on the workers' image.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import sys

import durabletrain as _dt
from durabletrain import _session


def _load():
    ref = os.environ.get("DTPY_FUNCTION", "")
    if not ref:
        raise SystemExit("durabletrain._rank: DTPY_FUNCTION is not set; want the pickled function's path or module:function")
    if ":" in ref and not os.path.exists(ref):
        mod, _, name = ref.partition(":")
        fn = importlib.import_module(mod)
        for part in name.split("."):
            fn = getattr(fn, part)
        return fn, _dt.config()
    want = os.environ.get("DTPY_FUNCTION_SHA256", "")
    with open(ref, "rb") as f:
        data = f.read()
    got = hashlib.sha256(data).hexdigest()
    if not want or got != want:
        raise SystemExit("durabletrain._rank: %s has SHA-256 %s; the run was started with %s: refused, not loaded" % (ref, got, want or "none"))
    import cloudpickle  # noqa: F401  (the pickle's classes may need it)
    import pickle
    payload = pickle.loads(data)
    config = dict(payload["config"] or {})
    config.update(_dt.config())  # a trial's values (a search's param_space) over the trainer's own
    return payload["function"], config


def _setup_torch() -> None:
    """The process group Ray Train sets up before the function runs."""
    if _dt.world_size() <= 1:
        return
    if not _dt._cuda():
        # A CPU slot: Accelerate (under a Transformers Trainer) takes a CPU
        # machine without use_cpu=True as no distributed run at all, and each
        # rank would train alone on the whole data set: tell it the ranks
        # are CPU processes of one gang (TrainingArguments reads this).
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_initialized():
        import datetime
        backend = os.environ.get("DTPY_TORCH_BACKEND") or _dt.backend()
        timeout = datetime.timedelta(seconds=int(os.environ.get("DTPY_TORCH_TIMEOUT_S", "1800")))
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)


def _unpack_working_dir() -> None:
    """The driver's working_dir, checked against its hash, as this rank's
    working directory and first on its sys.path."""
    path = os.environ.get("DTPY_WORKING_DIR")
    if not path:
        return
    import tarfile
    import tempfile
    with open(path, "rb") as f:
        data = f.read()
    got, want = hashlib.sha256(data).hexdigest(), os.environ.get("DTPY_WORKING_DIR_SHA256", "")
    if got != want:
        raise SystemExit("durabletrain._rank: %s has SHA-256 %s; the run was started with %s: refused, not unpacked" % (path, got, want or "none"))
    dest = tempfile.mkdtemp(prefix="working-dir-", dir=os.environ.get("TMPDIR") or None)
    import io
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar.getmembers():
            target = os.path.realpath(os.path.join(dest, m.name))
            if not (m.isfile() or m.isdir()) or not target.startswith(os.path.realpath(dest) + os.sep):
                raise SystemExit("durabletrain._rank: working_dir holds %r, which is not a file inside it: refused" % m.name)
        for m in tar.getmembers():
            tar.extract(m, dest)
    os.chdir(dest)


def main() -> None:
    _unpack_working_dir()
    sys.path.insert(0, os.getcwd())
    fn, config = _load()
    if os.environ.get("DTPY_FRAMEWORK", "torch") == "torch":
        _setup_torch()
    _session.active = True
    if not _session.begin_first():
        return
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    with _framework():
        if params:
            fn(config if config is not None else {})
        else:
            fn()
    _session.finish()


def _framework():
    """The collective a framework's function trains in, set up before it runs."""
    if os.environ.get("DTPY_FRAMEWORK") == "xgboost":
        from durabletrain.train import xgboost
        return xgboost.collective()
    import contextlib
    return contextlib.nullcontext()


if __name__ == "__main__":
    main()
