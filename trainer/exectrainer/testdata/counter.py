"""A stand-in rank program, standard library only: its "model" is a number
that each epoch adds epoch+1 to; its checkpoint is that number. Behaviour
switches for the tests: FAIL_AT_EPOCH exits 3 with a message there, HANG
sleeps forever in the epoch. With STEPS=n it trains n steps an epoch in
durabletrain.steps(), each adding 1000*(epoch+1) + step; NO_SAVE passes no
save=; CHECKPOINT_AT=s reports a checkpoint after step s (its index); HANG_AT=s
sleeps forever in step s; SEEN=path appends every step it trains there.
CLOSE_AFTER_EPOCH=e closes the control socket after reporting epoch e, and
CLOSE_ON_USR1 on SIGUSR1; half a second later it kills itself with SIGKILL
(CLOSE_THEN=kill) or sleeps forever."""
import json
import os
import signal
import socket
import sys
import time

import durabletrain as dt

value = 0
ckpt = dt.get_checkpoint()
if ckpt:
    with open(os.path.join(ckpt, "value.json")) as f:
        saved = json.load(f)
    value = saved["value"]
    if [saved.get("epoch", ckpt.epoch), saved.get("step", ckpt.step)] != [ckpt.epoch, ckpt.step]:
        sys.exit("counter: the checkpoint holds epoch %s step %s, resumed at %d %d" % (saved.get("epoch"), saved.get("step"), ckpt.epoch, ckpt.step))
out = "ckpt-%s" % os.environ["RANK"]


def save_at(epoch, step):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "value.json"), "w") as f:
        json.dump({"value": value, "epoch": epoch, "step": step}, f)
    return out


def save():
    return save_at(*dt.position())


def close_control_socket(*_):
    dt._sock.shutdown(socket.SHUT_RDWR)
    dt._sock.close()
    time.sleep(0.5)
    if os.environ.get("CLOSE_THEN") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600)


if os.environ.get("CLOSE_ON_USR1"):
    signal.signal(signal.SIGUSR1, close_control_socket)

steps = int(os.environ.get("STEPS", "0"))
for epoch in dt.epochs():
    if os.environ.get("FAIL_AT_EPOCH") == str(epoch):
        print("counter: cannot go on: the data is broken at epoch %d" % epoch, file=sys.stderr)
        sys.exit(3)
    if os.environ.get("HANG"):
        time.sleep(3600)
    if steps:
        for step in dt.steps(steps, save=None if os.environ.get("NO_SAVE") else save):
            if os.environ.get("HANG_AT") == str(step):
                time.sleep(3600)
            value += 1000 * (epoch + 1) + step
            if os.environ.get("SEEN"):
                with open(os.environ["SEEN"], "a") as f:
                    f.write("%d %d\n" % (epoch, step))
            dt.report({"train_loss": 1.0 / (step + 1)})
            if os.environ.get("CHECKPOINT_AT") == str(step):
                dt.report({"train_loss": 1.0 / (step + 1)}, checkpoint_dir=save())
    else:
        value += epoch + 1
    print("epoch %d value %d" % (epoch, value))
    dt.report({"train_loss": 1.0 / (epoch + 1), "test_loss": 0.5, "test_accuracy": value / 100.0}, checkpoint_dir=save_at(epoch + 1, 0))
    if os.environ.get("CLOSE_AFTER_EPOCH") == str(epoch):
        close_control_socket()
