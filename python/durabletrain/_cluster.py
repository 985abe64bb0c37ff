"""durabletrain.init(): Ray's ray.init() for durabletrain.

With no address (and no $TEMPORAL_ADDRESS), it starts a local cluster: the
embedded Temporal dev server (with its Web UI) and a worker process that
serves the workflows and offers CPU slots (or the host's GPUs, by NVML),
allowed to run this Python for the ranks, and stops them when the program
exits. With an address it connects to an existing cluster (whose workers
run the ranks: their policy must allow the command, see the README's
security model). fit() without init() calls init() itself.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

from durabletrain import _binaries

DEFAULT_CONTROL_QUEUE = "durabletrain"
DEFAULT_TASK_QUEUE = "durabletrain-gpu"


class _Loop:
    """An asyncio loop of the driver's own, in a thread, so that the
    synchronous API works the same from a script and from a notebook (whose
    own loop is already running)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="durabletrain-driver", daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: Optional[float] = None) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except (KeyboardInterrupt, concurrent.futures.TimeoutError):
            fut.cancel()
            raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """What the driver talks to: a Temporal address, its queues, and the
    storage runs default to; for a local cluster, the processes it started."""

    address: str
    namespace: str = "default"
    control_queue: str = DEFAULT_CONTROL_QUEUE
    task_queue: str = DEFAULT_TASK_QUEUE
    storage: Optional[str] = None  # a local directory runs default to
    ui: Optional[str] = None
    local: bool = False
    slots: int = 0
    dir: Optional[str] = None
    api_key: Optional[str] = None
    tls: bool = False
    codec_key_file: Optional[str] = None
    procs: List[subprocess.Popen] = field(default_factory=list)
    pids: List[int] = field(default_factory=list)
    owned: bool = False  # this process started it (and stops it at exit)
    _state_file: Optional[str] = None
    _client: Any = None
    _runtime: Any = None
    _loop: Optional[_Loop] = None

    @property
    def loop(self) -> _Loop:
        if self._loop is None:
            self._loop = _Loop()
        return self._loop

    def client(self) -> Any:
        if self._client is None:
            from temporalio.client import Client

            kwargs: dict = {}
            if self.codec_key_file:
                from durabletrain import codec
                kwargs["data_converter"] = codec.data_converter(codec.PayloadCodec.from_key_file(self.codec_key_file))

            # A runtime of our own (its Tokio threads), which close() drops at
            # exit while the interpreter still runs: the default runtime lives
            # until finalization, when its threads' last calls into Python
            # abort the process (temporalio/sdk-python#300).
            if self._runtime is None:
                from temporalio.runtime import Runtime, TelemetryConfig
                self._runtime = Runtime(telemetry=TelemetryConfig())
                atexit.register(self.close)
            kwargs["runtime"] = self._runtime

            async def connect() -> Any:
                return await Client.connect(self.address, namespace=self.namespace, api_key=self.api_key, tls=self.tls, **kwargs)
            deadline = time.monotonic() + 30
            while True:
                try:
                    self._client = self.loop.run(connect())
                    break
                except Exception as e:  # the server may still be starting
                    if time.monotonic() > deadline:
                        raise ConnectionError("durabletrain: cannot reach Temporal at %s: %s" % (self.address, e)) from e
                    time.sleep(0.2)
        return self._client

    def close(self) -> None:
        """Drops the client, its runtime and the driver's loop thread, so that
        nothing of Temporal's is left running when the interpreter finalizes.
        Runs at exit; a later client() connects again."""
        import gc
        loop, self._loop = self._loop, None
        if loop is not None:
            async def drain() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            try:
                asyncio.run_coroutine_threadsafe(drain(), loop.loop).result(5)
            except Exception:
                pass
            loop.loop.call_soon_threadsafe(loop.loop.stop)
            loop.thread.join(5)
            if not loop.thread.is_alive():
                loop.loop.close()
        self._client = None
        self._runtime = None
        gc.collect()

    def ensure_slots(self, n: int) -> None:
        """A local cluster grows to n CPU slots for a run of n ranks."""
        if self.local and n > self.slots:
            self._start_worker(n - self.slots, "agent", "durabletrain-local-%d" % len(self.procs))

    def _start_worker(self, slots: int, role: str, identity: str) -> None:
        assert self.dir is not None
        py = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        log = open(os.path.join(self.dir, "%s.log" % identity), "ab")
        args = [_binaries.find("worker"), "-address", self.address, "-namespace", self.namespace, "-role", role,
                "-slots", str(slots), "-identity", identity, "-control-queue", self.control_queue, "-task-queue", self.task_queue,
                "-allow-exec", sys.executable, "-exec-dirs", "/",
                "-storage-roots", "file:///", "-trackers", "*", "-grace", "20s", "-log-format", "json"]
        if self.codec_key_file:
            args += ["-codec-key-file", os.path.abspath(self.codec_key_file)]
        env = dict(os.environ, DURABLETRAIN_PYTHONPATH=py, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        p = subprocess.Popen(args, stdout=log, stderr=log, env=env, start_new_session=True)
        self.procs.append(p)
        self.pids.append(p.pid)
        self.slots += slots
        self._save()

    def _save(self) -> None:
        import json
        if not self._state_file:
            return
        if not self.pids:
            self.pids = [p.pid for p in self.procs]
        tmp = self._state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"address": self.address, "namespace": self.namespace, "control_queue": self.control_queue,
                       "task_queue": self.task_queue, "storage": self.storage, "ui": self.ui, "slots": self.slots,
                       "pids": self.pids}, f)
        os.replace(tmp, self._state_file)

    def stop(self) -> None:
        """Stops what a local cluster started (SIGTERM: the ranks leave with a
        checkpoint; a run in flight resumes when a cluster starts again on the
        same state), and workers this process added to a cluster it joined."""
        if self.owned and self._state_file:
            try:
                os.remove(self._state_file)
            except OSError:
                pass
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(25)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()


_cluster: Optional[Cluster] = None
_lock = threading.Lock()


def init(address: Optional[str] = None, *, namespace: Optional[str] = None, num_cpus: Optional[int] = None,
         storage: Optional[str] = None, control_queue: Optional[str] = None, task_queue: Optional[str] = None,
         codec_key_file: Optional[str] = None, ui: bool = True, ignore_reinit_error: bool = True) -> Cluster:
    """Starts a local cluster, or connects to one (Ray's ray.init()).

    address: a Temporal frontend host:port; None reads $TEMPORAL_ADDRESS
    (with $TEMPORAL_NAMESPACE, $TEMPORAL_API_KEY, $TEMPORAL_TLS), and
    without it starts the embedded dev server and a worker with num_cpus
    CPU slots (default: at least 2) on this machine, which outlives a driver
    that is killed (the next init() joins it) and stops with the one that
    started it. control_queue, task_queue and storage default to
    $DURABLETRAIN_CONTROL_QUEUE, $DURABLETRAIN_TASK_QUEUE and
    $DURABLETRAIN_STORAGE_PATH; codec_key_file ($DURABLETRAIN_CODEC_KEY_FILE)
    is the workers' -codec-key-file, for a deployment whose payloads are
    encrypted (durabletrain.codec).
    storage: the directory runs keep checkpoints in by default
    (~/durabletrain_results for a local cluster).

    Example:
        >>> import durabletrain
        >>> cluster = durabletrain.init()          # doctest: +SKIP
        >>> cluster.ui                              # doctest: +SKIP
        'http://127.0.0.1:8233'
    """
    global _cluster
    with _lock:
        if _cluster is not None:
            if not ignore_reinit_error:
                raise RuntimeError("durabletrain.init() was called already (%s)" % _cluster.address)
            return _cluster
        if address == "auto":  # Ray's "the cluster that is running": $TEMPORAL_ADDRESS, else this machine's local one
            address = os.environ.get("TEMPORAL_ADDRESS") or _running_local(namespace or os.environ.get("TEMPORAL_NAMESPACE") or "default")
            if not address:
                raise ConnectionError("durabletrain.init(address=\"auto\"): no cluster is running here ($TEMPORAL_ADDRESS is unset and "
                                      "%s has none); call durabletrain.init() without an address to start one" % home())
        if address == "local":
            address = None
        address = address or os.environ.get("TEMPORAL_ADDRESS")
        namespace = namespace or os.environ.get("TEMPORAL_NAMESPACE") or "default"
        control_queue = control_queue or os.environ.get("DURABLETRAIN_CONTROL_QUEUE") or DEFAULT_CONTROL_QUEUE
        task_queue = task_queue or os.environ.get("DURABLETRAIN_TASK_QUEUE") or DEFAULT_TASK_QUEUE
        storage = storage or os.environ.get("DURABLETRAIN_STORAGE_PATH") or None
        codec_key_file = codec_key_file or os.environ.get("DURABLETRAIN_CODEC_KEY_FILE") or None
        if codec_key_file:
            from durabletrain import codec
            codec.read_key_file(codec_key_file, "durabletrain.init: codec_key_file")
        if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1):
            raise ValueError("durabletrain.init: num_cpus is %r; want a whole number of at least 1" % (num_cpus,))
        if address:
            c = Cluster(address=address, namespace=namespace, control_queue=control_queue, task_queue=task_queue,
                        storage=storage, api_key=os.environ.get("TEMPORAL_API_KEY") or None, codec_key_file=codec_key_file,
                        tls=os.environ.get("TEMPORAL_TLS", "").lower() in ("1", "true", "yes"))
            c.client()
            _cluster = c
            return c
        _cluster = _start_local(namespace, num_cpus, storage, control_queue, task_queue, ui, codec_key_file)
        return _cluster


def home() -> str:
    """Where a local cluster keeps its state: $DURABLETRAIN_HOME, else ~/.durabletrain/local."""
    return os.path.abspath(os.environ.get("DURABLETRAIN_HOME") or os.path.join(os.path.expanduser("~"), ".durabletrain", "local"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def _running_local(namespace: str) -> Optional[str]:
    """The address of this machine's local cluster, if one is up."""
    import json
    try:
        with open(os.path.join(home(), "cluster.json")) as f:
            st = json.load(f)
    except (OSError, ValueError):
        return None
    if st.get("namespace") == namespace and all(_alive(p) for p in st.get("pids", [])) and _reachable(st["address"]):
        return "local"  # init() then joins it
    return None


def _start_local(namespace: str, num_cpus: Optional[int], storage: Optional[str], control_queue: str, task_queue: str, ui: bool,
                 codec_key_file: Optional[str] = None) -> Cluster:
    """The local cluster of this machine's user: the one a driver before
    this one started, if it is still up (so a driver that died and is run
    again finds its run), else a new one. Its Temporal state is a SQLite
    file under home(): a run left behind by a stopped cluster resumes when
    the next one starts."""
    import fcntl
    import json
    start = time.monotonic()
    d = home()
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state_file = os.path.join(d, "cluster.json")
        try:
            with open(state_file) as f:
                st = json.load(f)
        except (OSError, ValueError):
            st = None
        if st and st.get("namespace") == namespace and all(_alive(p) for p in st.get("pids", [])) and _reachable(st["address"]):
            c = Cluster(address=st["address"], namespace=namespace, control_queue=st["control_queue"], task_queue=st["task_queue"],
                        storage=storage and os.path.abspath(storage) or st["storage"], local=True, dir=d, ui=st.get("ui"), slots=st.get("slots", 0),
                        codec_key_file=codec_key_file)
            c.client()
            # Workers this driver adds (ensure_slots) are its own: they stop with it, and the state file does not list them.
            print("durabletrain: joined the local cluster at %s (%d slots; Web UI %s)" % (c.address, c.slots, c.ui), file=sys.stderr, flush=True)
            return c
        storage = os.path.abspath(storage or os.path.join(os.path.expanduser("~"), "durabletrain_results"))
        os.makedirs(storage, exist_ok=True)
        port = _free_port()
        ui_port = _free_port() if ui else 0
        c = Cluster(address="127.0.0.1:%d" % port, namespace=namespace, control_queue=control_queue, task_queue=task_queue,
                    storage=storage, local=True, dir=d, ui="http://127.0.0.1:%d" % ui_port if ui_port else None,
                    codec_key_file=codec_key_file)
        c.owned = True
        c._state_file = state_file
        atexit.register(c.stop)
        log = open(os.path.join(d, "devserver.log"), "ab")
        c.procs.append(subprocess.Popen([_binaries.find("devserver"), "-port", str(port), "-ui-port", str(ui_port),
                                         "-db", os.path.join(d, "temporal.db"), "-namespace", namespace],
                                        stdout=log, stderr=log, start_new_session=True))
        c._start_worker(max(2, num_cpus or 0), "both", "durabletrain-local")
        c.client()
        print("durabletrain: local cluster up in %.1f s: Temporal at %s%s; checkpoints in %s; logs in %s" % (
            time.monotonic() - start, c.address, ", Web UI " + c.ui if c.ui else "", storage, d), file=sys.stderr, flush=True)
        return c


def shutdown() -> None:
    """Stops the local cluster init() started (runs in it stop with a checkpoint)."""
    global _cluster
    with _lock:
        if _cluster is not None:
            _cluster.stop()
            _cluster = None


def current() -> Cluster:
    return _cluster if _cluster is not None else init()
