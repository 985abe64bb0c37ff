"""Ctrl-C in a terminal asks whether to stop the run or leave it running,
and does what it is told: a real driver in a real pseudo-terminal."""

import os
import pty
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import wait_for

DRIVER = textwrap.dedent('''
    from durabletrain import train
    from durabletrain.train import RunConfig, ScalingConfig
    from durabletrain.train.torch import TorchTrainer

    def loop():
        import os, tempfile, time
        from durabletrain import train
        ck = train.get_checkpoint()
        start = int(open(os.path.join(ck.path, "i")).read()) + 1 if ck else 0
        for i in range(start, 3000):  # minutes: a loaded machine must not finish it before the test looks
            time.sleep(0.1)
            with tempfile.TemporaryDirectory() as d:
                open(os.path.join(d, "i"), "w").write(str(i))
                train.report({"i": i}, checkpoint=train.Checkpoint.from_directory(d))

    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=1), run_config=RunConfig(name={name!r})).fit()
''')


def _read_until(fd, want, timeout=60):
    out = b""
    deadline = time.monotonic() + timeout
    while want.encode() not in out:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("never saw %r; the terminal shows:\n%s" % (want, out.decode(errors="replace")))
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    return out.decode(errors="replace")


@pytest.mark.parametrize("answer, state", [("s", "stopped"), ("", "running")])
def test_ctrl_c_asks_whether_to_stop_the_run(cluster, tmp_path, answer, state):
    name = "fit-ctrl-c-" + (answer or "leave")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.replace("{name!r}", repr(name)))
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, str(script)])
    try:
        _read_until(fd, "iteration 2")
        os.kill(pid, signal.SIGINT)  # what Ctrl-C sends
        _read_until(fd, "or leave it running?")
        os.write(fd, (answer + "\n").encode())
        _read_until(fd, "asked %s to stop" % name if answer else "%s goes on" % name)
        os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    h = cluster.client().get_workflow_handle(name)

    def status():
        try:
            return cluster.loop.run(h.query("progress"))["state"]
        except Exception:
            return None
    if state == "stopped":
        assert wait_for("the run to stop", lambda: status() == "stopped", timeout=180)
    else:
        time.sleep(2)
        assert status() in ("training", "forming-gang"), status()
        cluster.loop.run(h.cancel())
