"""A stand-in rank program, standard library only: its "model" is a number
that each epoch adds epoch+1 to; its checkpoint is that number. Behaviour
switches for the tests: FAIL_AT_EPOCH exits 3 with a message there, HANG
sleeps forever in the epoch."""
import json
import os
import sys
import time

import durabletrain as dt

value = 0
ckpt = dt.get_checkpoint()
if ckpt:
    with open(os.path.join(ckpt, "value.json")) as f:
        value = json.load(f)["value"]
out = "ckpt-%s" % os.environ["RANK"]
for epoch in dt.epochs():
    if os.environ.get("FAIL_AT_EPOCH") == str(epoch):
        print("counter: cannot go on: the data is broken at epoch %d" % epoch, file=sys.stderr)
        sys.exit(3)
    if os.environ.get("HANG"):
        time.sleep(3600)
    value += epoch + 1
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "value.json"), "w") as f:
        json.dump({"value": value}, f)
    print("epoch %d value %d" % (epoch, value))
    dt.report({"train_loss": 1.0 / (epoch + 1), "test_loss": 0.5, "test_accuracy": value / 100.0}, checkpoint_dir=out)
