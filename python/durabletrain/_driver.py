"""What TorchTrainer.fit() does: build the run's spec from Ray's configs,
check it with the Go side's own validation, ship the function, start
TrainingWorkflow (or attach to the run of the same name), follow it, and
turn its Progress into a Result.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

from durabletrain import _binaries
from durabletrain._configs import RunConfig, ScalingConfig
from durabletrain._progress import Follower

WORKFLOW_TRAINING = "TrainingWorkflow"
QUERY_PROGRESS = "progress"
#: The most a working_dir may hold (it is unpacked by every rank).
MAX_WORKING_DIR_BYTES = 100 << 20
#: The metrics durabletrain names itself; the rest are a report's own (Other).
CORE_METRICS = ("train_loss", "test_loss", "test_accuracy")


class SpecError(ValueError):
    """The Go side refused the spec (starter check): its words, naming the field."""


def check_spec(spec: Dict[str, Any], kind: str = "training") -> Dict[str, Any]:
    """The spec as the workflow would take it (defaults filled), or SpecError."""
    raw = json.dumps(spec)
    out = subprocess.run([_binaries.find("starter"), "check", "-kind", kind], input=raw, capture_output=True, text=True)
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip()
        raise SpecError(msg[len("starter: "):] if msg.startswith("starter: ") else msg)
    return json.loads(out.stdout)


def _storage_url(path: str) -> str:
    if "://" in path:
        return path
    return "file://" + os.path.abspath(os.path.expanduser(path))


def _local_dir(url: str) -> Optional[str]:
    if url.startswith("file://"):
        return url[len("file://"):].split("?")[0]
    return None


def metrics_of(m: Dict[str, Any]) -> Dict[str, float]:
    """An epoch's record (spec.EpochMetrics) as the dict the function reported."""
    out = dict(m.get("other") or {})
    absent = set(m.get("absent") or [])
    for k in CORE_METRICS:
        if k not in absent and k in m:
            out[k] = m[k]
    out["training_iteration"] = int(m.get("epoch", 0)) + 1
    return out


def _system_file(path: str) -> bool:
    import sysconfig
    system = [sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    return (any(p and path.startswith(os.path.abspath(p) + os.sep) for p in system) or "site-packages" in path
            or "dist-packages" in path or path.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep))


def _user_modules(fn: Any) -> List[Any]:
    """The user's own modules that fn's code may use: fn's module (unless
    __main__, which cloudpickle ships by value already) and every module
    loaded from the directory of fn's file or of the main script, outside
    site-packages, the standard library and durabletrain. They travel by
    value: the workers need not have the files."""
    dirs = set()
    for m in (sys.modules.get(getattr(fn, "__module__", "") or ""), sys.modules.get("__main__")):
        f = getattr(m, "__file__", None)
        if f and not _system_file(os.path.abspath(f)):
            dirs.add(os.path.dirname(os.path.abspath(f)))
    out = []
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not f or name == "__main__" or name.split(".")[0] == "durabletrain":
            continue
        path = os.path.abspath(f)
        if os.path.dirname(path) in dirs and not _system_file(path):
            out.append(mod)
    return out


class Job:
    """One training run of a trainer, from its configs."""

    def __init__(self, fn: "Callable[..., Any] | str", config: Optional[Dict[str, Any]], scaling: Optional[ScalingConfig],
                 run: Optional[RunConfig], *, datasets: Any = None, resume_from_checkpoint: Any = None, working_dir: Optional[str] = None,
                 framework: str = "torch", owner: str = "TorchTrainer") -> None:
        if not callable(fn) and not (isinstance(fn, str) and ":" in fn):
            raise TypeError("%s: train_loop_per_worker is %r; want a function, or \"module:function\" on the workers" % (owner, fn))
        if config is not None and not isinstance(config, dict):
            raise TypeError("%s: train_loop_config is %r; want a dict" % (owner, config))
        if scaling is not None and not isinstance(scaling, ScalingConfig):
            raise TypeError("%s: scaling_config is %r; want a durabletrain.train.ScalingConfig" % (owner, scaling))
        if run is not None and not isinstance(run, RunConfig):
            raise TypeError("%s: run_config is %r; want a durabletrain.train.RunConfig" % (owner, run))
        if datasets:
            raise ValueError("%s: datasets is not supported yet: load the data inside train_loop_per_worker "
                             "(prepare_data_loader shards it)" % owner)
        if working_dir is not None and not os.path.isdir(working_dir):
            raise ValueError("%s: working_dir is %r, not a directory" % (owner, working_dir))
        self.fn, self.config = fn, dict(config or {})
        self.scaling, self.run = scaling or ScalingConfig(), run or RunConfig()
        self.resume_from = resume_from_checkpoint
        self.working_dir = os.path.abspath(working_dir) if working_dir else None
        self.framework, self.owner = framework, owner
        self.name = self.run.name or "%s_%s_%s" % (owner, time.strftime("%Y-%m-%d_%H-%M-%S"), uuid.uuid4().hex[:5])
        self._spec: Optional[Dict[str, Any]] = None
        self.extra_env: Dict[str, str] = {}

    def _storage(self, cluster: Any) -> str:
        path = self.run.storage_path or cluster.storage
        if not path:
            raise ValueError("%s: RunConfig.storage_path is not set and the cluster at %s names no default storage; "
                             "want a directory every worker reads, or a blob URL" % (self.owner, cluster.address))
        return _storage_url(path)

    def _put(self, storage: str, kind: str, data: bytes, suffix: str, what: str) -> Any:
        """data in the run's storage under its SHA-256: (path, hash)."""
        local = _local_dir(storage)
        if local is None:
            raise ValueError("%s: RunConfig.storage_path is %s; %s needs storage the workers read as a directory "
                             "(file://, a shared file system); or pass \"module:function\" on the workers' image" % (self.owner, storage, what))
        sha = hashlib.sha256(data).hexdigest()
        d = os.path.join(local, kind)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, sha + suffix)
        if not os.path.exists(path):
            tmp = path + ".tmp%d" % os.getpid()
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        return path, sha

    def _ship_working_dir(self, storage: str) -> Dict[str, str]:
        """The working directory, as Ray's runtime_env working_dir: a tar.gz
        in the run's storage by hash, unpacked by each rank as its working
        directory (and on its sys.path)."""
        if not self.working_dir:
            return {}
        import io
        import tarfile
        buf = io.BytesIO()
        size = 0
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for root, dirs, files in os.walk(self.working_dir):
                dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__", ".venv"))
                for name in sorted(files):
                    full = os.path.join(root, name)
                    if os.path.islink(full):
                        continue
                    size += os.path.getsize(full)
                    if size > MAX_WORKING_DIR_BYTES:
                        raise ValueError("%s: working_dir %s holds more than %d MiB; want code and small files "
                                         "(read data from storage)" % (self.owner, self.working_dir, MAX_WORKING_DIR_BYTES >> 20))
                    info = tar.gettarinfo(full, arcname=os.path.relpath(full, self.working_dir))
                    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
        path, sha = self._put(storage, "_working_dirs", buf.getvalue(), ".tar.gz", "working_dir")
        return {"DTPY_WORKING_DIR": path, "DTPY_WORKING_DIR_SHA256": sha}

    def _ship(self, storage: str) -> Dict[str, str]:
        """Where the ranks find the function: in the run's storage, by hash."""
        if isinstance(self.fn, str):
            return {"DTPY_FUNCTION": self.fn}
        import cloudpickle
        by_value = _user_modules(self.fn)
        try:
            for m in by_value:
                cloudpickle.register_pickle_by_value(m)
            data = cloudpickle.dumps({"function": self.fn, "config": self.config})
        except Exception as e:
            raise TypeError("%s: train_loop_per_worker or train_loop_config cannot be pickled (%s); define what it uses "
                            "inside the function, or pass \"module:function\"" % (self.owner, e)) from e
        finally:
            for m in by_value:
                cloudpickle.unregister_pickle_by_value(m)
        path, sha = self._put(storage, "_functions", data, ".pkl", "a function shipped by value")
        return {"DTPY_FUNCTION": path, "DTPY_FUNCTION_SHA256": sha}

    def build_spec(self, cluster: Any) -> Dict[str, Any]:
        storage = self._storage(cluster)
        env = {"DTPY_FRAMEWORK": self.framework, "DTPY_STORAGE": storage, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        env.update(self.extra_env)
        env.update(self._ship(storage))
        env.update(self._ship_working_dir(storage))
        scaling = self.scaling.to_spec()
        scaling.setdefault("task_queue", cluster.task_queue)
        checkpoint = {"url": storage}
        checkpoint.update(self.run.checkpoint_config.to_spec())
        spec: Dict[str, Any] = {
            "name": self.name,
            "trainer": "exec",
            "exec": dict({"command": [sys.executable, "-m", "durabletrain._rank"], "env": env},
                         **({"warm_spare": True} if self.run.failure_config.warm_spares else {})),
            "hyper": {"epochs": self.run.max_iterations},
            "scaling": scaling,
            "checkpoint": checkpoint,
            "failure": self.run.failure_config.to_spec(),
        }
        if cluster.local:
            # The local dev server has durabletrain's search attributes: the Web UI lists runs by
            # DurabletrainState and DurabletrainEpoch (a namespace of your own may lack them).
            spec["search_attributes"] = True
        if cluster.local and not self.working_dir:
            spec["exec"]["dir"] = os.getcwd()  # a local cluster's ranks start where the driver is, as Ray's do
        if isinstance(self.fn, str) and self.config:
            # Named code gets train_loop_config through the run's config (JSON), not a pickle.
            try:
                json.dumps(self.config)
            except (TypeError, ValueError) as e:
                raise TypeError("%s: train_loop_config of \"module:function\" code travels as JSON: %s" % (self.owner, e)) from None
            spec["config"] = dict(self.config)
        if self.resume_from is not None:
            from durabletrain.train import Result
            run = self.resume_from
            if isinstance(run, Result):
                run = run.name
            if not isinstance(run, str):
                raise TypeError("%s: resume_from_checkpoint is %r; want a run's name or its Result" % (self.owner, self.resume_from))
            spec["resume_from"] = run
        cb = self.run.mlflow
        if cb is not None:
            spec["mlflow"] = self.mlflow_section(cb)
        return spec

    def mlflow_section(self, cb: Any, prefix: Optional[str] = "train_loop_config") -> Dict[str, Any]:
        """The spec's mlflow section for a run logged by ``cb``: the params
        are the trial's config as Ray logs it ({"train_loop_config": {...}}
        flattened: train_loop_config/lr), the spec's config (JSON) under the
        prefix, the pickled config as the section's params."""
        out = cb.to_spec()
        if prefix:
            out["config_prefix"] = prefix
        if not isinstance(self.fn, str) and self.config:
            values = mlflow_params(self.config, self.owner)
            if values:
                out["params"] = {prefix: values} if prefix else values
        return out

    def spec(self, cluster: Any = None) -> Dict[str, Any]:
        if self._spec is None:
            from durabletrain import _cluster
            cluster = cluster or _cluster.current()
            spec = self.build_spec(cluster)
            check_spec(spec)
            self._spec = spec
        return self._spec

    def fit(self) -> Any:
        from durabletrain import _cluster
        from durabletrain.train import TrainingFailedError
        cluster = _cluster.current()
        try:
            spec = self.spec(cluster)
        except SpecError as e:
            raise ValueError("%s: the run's spec was refused before it started: %s" % (self.owner, e)) from None
        cluster.ensure_slots(self.scaling.num_workers)
        handle, attached = start_or_attach(cluster, self.name, WORKFLOW_TRAINING, spec)
        follower = Follower(self.name, verbose=self.run.verbose, attached=attached, ui=cluster.ui)
        progress, error = follow(cluster, handle, follower)
        result = result_of(progress, spec, error)
        if error is not None or result.state not in ("completed", "stopped"):
            raise TrainingFailedError("%s %s: %s" % (self.owner, self.name, error or "the run ended %s" % result.state), result)
        return result


#: The spec's bound on mlflow.params, as JSON (spec.MaxTrackerParamsBytes).
MAX_TRACKER_PARAMS_BYTES = 8 << 10


def _jsonable(v: Any, depth: int = 0) -> Any:
    """A config value as MLflow can log it: JSON's own, else its str()
    (as Ray's MLflow callback logs an object), cut to 6,000 characters."""
    if v is None or isinstance(v, (bool, int, float)):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return str(v)
        return v
    if isinstance(v, str):
        return v[:6000]
    if isinstance(v, dict) and depth < 8:
        return {str(k): _jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)) and depth < 8:
        try:
            text = json.dumps([_jsonable(x, depth + 1) for x in v])
        except (TypeError, ValueError):
            text = str(v)
        return text[:6000]
    try:
        import numpy
        if isinstance(v, numpy.generic):
            return _jsonable(v.item(), depth)
    except ImportError:
        pass
    return str(v)[:6000]


def mlflow_params(config: Dict[str, Any], owner: str) -> Dict[str, Any]:
    """train_loop_config as the mlflow section's params: JSON values, the
    largest keys left out (with a warning) past MAX_TRACKER_PARAMS_BYTES."""
    import warnings
    values = {str(k): _jsonable(v) for k, v in config.items()}
    dropped = []
    while values and len(json.dumps(values)) > MAX_TRACKER_PARAMS_BYTES - 512:
        biggest = max(values, key=lambda k: len(json.dumps(values[k])))
        dropped.append(biggest)
        del values[biggest]
    if dropped:
        warnings.warn("%s: train_loop_config is more than %d KiB as MLflow params; not logged to MLflow: %s"
                      % (owner, MAX_TRACKER_PARAMS_BYTES >> 10, ", ".join(sorted(dropped))), stacklevel=3)
    return values


def start_or_attach(cluster: Any, workflow_id: str, workflow: str, arg: Any) -> Any:
    """The run's handle: a new one, or the existing run of that ID (running
    or ended: Ray Train V2's resume by name), also when another driver starts
    it at the same moment."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.service import RPCError, RPCStatusCode
    client = cluster.client()

    async def existing() -> Any:
        h = client.get_workflow_handle(workflow_id)
        try:
            d = await h.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return h, "running" if d.status == WorkflowExecutionStatus.RUNNING else "ended"

    async def go() -> Any:
        found = await existing()
        if found is not None:
            return found
        try:
            return await client.start_workflow(workflow, arg, id=workflow_id, task_queue=cluster.control_queue), None
        except WorkflowAlreadyStartedError:
            return await existing() or (client.get_workflow_handle(workflow_id), "running")
    return cluster.loop.run(go())


def follow(cluster: Any, handle: Any, follower: Follower, every: float = 2.0) -> Any:
    """Follows the run until it ends: its result awaited once, its progress
    polled meanwhile; returns (progress, error)."""
    import asyncio

    async def poll() -> Any:
        try:
            return await handle.query(QUERY_PROGRESS)
        except Exception:
            return None

    async def outcome() -> Any:
        try:
            return await handle.result(), None
        except Exception as e:
            cause = e
            while getattr(cause, "cause", None) is not None:
                cause = cause.cause
            return None, "%s" % (cause or e)

    done = asyncio.run_coroutine_threadsafe(outcome(), cluster.loop.loop)
    progress = None
    try:
        while True:
            try:
                final, error = done.result(timeout=every)
            except concurrent.futures.TimeoutError:
                p = cluster.loop.run(poll())
                if p is not None:
                    progress = p
                    follower.update(p)
                continue
            last = final if isinstance(final, dict) else (cluster.loop.run(poll()) or progress)
            follower.update(last, final=True)
            return last, error
    except KeyboardInterrupt:
        done.cancel()
        if follower.ask_stop():
            cluster.loop.run(handle.signal("stop"))
            print("durabletrain: asked %s to stop at the next step with a checkpoint" % handle.id, file=sys.stderr)
        else:
            print("durabletrain: %s goes on; fit() again with RunConfig(name=%r) attaches to it" % (handle.id, handle.id), file=sys.stderr)
        raise


def result_of(p: Optional[Dict[str, Any]], spec: Dict[str, Any], error: Optional[str]) -> Any:
    from durabletrain.train import Checkpoint, Result
    p = p or {}
    history = [metrics_of(m) for m in p.get("metrics") or []]
    ref = p.get("latest_checkpoint")
    ckpt = None
    if ref:
        ckpt = Checkpoint(url=ref["url"], run=ref["run"], id=ref["id"], epoch=ref.get("epoch", 0), step=ref.get("step", 0),
                          metrics=history[-1] if history else {})
    url = spec["checkpoint"]["url"]
    return Result(metrics=history[-1] if history else {}, checkpoint=ckpt, path="%s/%s" % (url.split("?")[0], spec["name"]),
                  name=spec["name"], state=p.get("state", "failed" if error else "unknown"),
                  error=RuntimeError(error) if error else None,
                  best_checkpoints=[(ckpt, ckpt.metrics)] if ckpt else [], metrics_history=history,
                  incidents=list(p.get("incidents") or []), failures=p.get("failures", 0), preemptions=p.get("preemptions", 0),
                  progress=p)
