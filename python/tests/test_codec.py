"""The payload codec from Python reads and writes what the Go side's does:
a run started from Python through a worker with -codec-key-file, its
history encrypted, its result read back."""

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("cryptography")

from durabletrain import _binaries, codec  # noqa: E402
from temporalio.api.common.v1 import Payload  # noqa: E402

from conftest import wait_for  # noqa: E402


def key_file(tmp_path, name="key", content=b"0123456789abcdef0123456789abcdef\n"):
    p = tmp_path / name
    fd = os.open(str(p), os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, content)
    os.close(fd)
    return str(p)


def test_a_key_file_is_read_as_the_go_side_reads_it(tmp_path):
    loose = tmp_path / "loose"
    loose.write_bytes(b"x" * 40)
    os.chmod(str(loose), 0o644)
    with pytest.raises(ValueError, match="can be read by others"):
        codec.read_key_file(str(loose))
    with pytest.raises(ValueError, match="want at least 32"):
        codec.read_key_file(key_file(tmp_path, "short", b"abc\n"))
    assert codec.read_key_file(key_file(tmp_path)) == b"0123456789abcdef0123456789abcdef"


def test_round_trip_rotation_and_tampering(tmp_path):
    old = codec.PayloadCodec(b"o" * 32)
    new = codec.PayloadCodec(b"n" * 32, b"o" * 32)
    p = Payload(metadata={"encoding": b"json/plain"}, data=b'{"a": 1}')
    sealed = asyncio.run(old.encode([p]))
    assert sealed[0].metadata["encoding"] == b"binary/encrypted" and b'"a"' not in sealed[0].data
    assert asyncio.run(new.decode(sealed)) == [p]  # an older key still reads
    bad = Payload()
    bad.CopyFrom(sealed[0])
    bad.data = bad.data[:-1] + bytes([bad.data[-1] ^ 1])
    with pytest.raises(ValueError, match="altered or damaged"):
        asyncio.run(new.decode([bad]))
    with pytest.raises(ValueError, match="encrypted with key"):
        asyncio.run(codec.PayloadCodec(b"z" * 32).decode(sealed))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b"1")
    assert asyncio.run(new.decode([plain])) == [plain]


DRIVER = textwrap.dedent('''
    from durabletrain import train
    from durabletrain.train import RunConfig, ScalingConfig
    from durabletrain.train.torch import TorchTrainer

    def loop():
        for i in range(2):
            train.report({"i": i})

    r = TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=1), run_config=RunConfig(name="codec-run")).fit()
    print("RESULT", r.state, r.metrics["training_iteration"], flush=True)
''')


def test_a_run_started_from_python_with_the_codec_is_encrypted_in_history(cluster, tmp_path):
    key = key_file(tmp_path)
    worker = subprocess.Popen([_binaries.find("worker"), "-address", cluster.address, "-role", "both", "-slots", "1",
                               "-identity", "codec-worker", "-control-queue", "codec-ctl", "-task-queue", "codec-gpu",
                               "-allow-exec", sys.executable, "-exec-dirs", "/", "-storage-roots", "file:///", "-codec-key-file", key],
                              stdout=subprocess.DEVNULL, stderr=open(str(tmp_path / "worker.log"), "wb"))
    try:
        script = tmp_path / "driver.py"
        script.write_text(DRIVER)
        env = dict(os.environ, TEMPORAL_ADDRESS=cluster.address, DURABLETRAIN_CODEC_KEY_FILE=key, DURABLETRAIN_CONTROL_QUEUE="codec-ctl",
                   DURABLETRAIN_TASK_QUEUE="codec-gpu", DURABLETRAIN_STORAGE_PATH=str(tmp_path / "store"))
        out = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr + open(str(tmp_path / "worker.log")).read()[-3000:]
        assert "RESULT completed 2" in out.stdout, out.stdout
        # Through a client without the key, the run's input and result are ciphertext.
        client = cluster.client()

        async def first_and_last():
            events = [e async for e in client.get_workflow_handle("codec-run").fetch_history_events()]
            started = events[0].workflow_execution_started_event_attributes.input.payloads[0]
            done = events[-1].workflow_execution_completed_event_attributes.result.payloads[0]
            return started, done
        started, done = cluster.loop.run(first_and_last())
        for p in (started, done):
            assert p.metadata["encoding"] == b"binary/encrypted", p.metadata
            assert b"durabletrain._rank" not in p.data and b"training_iteration" not in p.data
    finally:
        worker.terminate()
        worker.wait(30)
