"""The Temporal Web UI, in a browser: Playwright drives Debian's Chromium
(headless) through the local cluster's UI, opens a running run that has
had a failure, and checks that what a person sees there (the status, the
current details, the memo, the search attributes, the progress query run
from the Queries tab, the run in a list filtered by DurabletrainState)
says what the progress query says. Screenshots of each page are kept in
.artifacts/web-ui/ (DURABLETRAIN_ARTIFACTS moves it)."""

import json
import os
import re
import shutil
import signal
import threading
import urllib.parse

import pytest

pytest.importorskip("torch")
sync_api = pytest.importorskip("playwright.sync_api")

from durabletrain._driver import QUERY_PROGRESS  # noqa: E402
from durabletrain.train import RunConfig, ScalingConfig  # noqa: E402
from durabletrain.train.torch import TorchTrainer  # noqa: E402

from conftest import REPO, rank_pids, wait_for  # noqa: E402
from test_fit import linear_loop  # noqa: E402


def chromium():
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        msg = "no Chromium (scripts/deps.sh test installs Debian's chromium)"
        if os.environ.get("DURABLETRAIN_REQUIRE_SERVICES"):
            pytest.fail(msg + "; DURABLETRAIN_REQUIRE_SERVICES is set")
        pytest.skip(msg)
    return path


def artifacts():
    d = os.path.join(os.environ.get("DURABLETRAIN_ARTIFACTS") or os.path.join(REPO, ".artifacts"), "web-ui")
    os.makedirs(d, exist_ok=True)
    return d


def progress_of(cluster, name):
    """The run's progress query's answer; None before the run has started."""
    from temporalio.service import RPCError
    h = cluster.client().get_workflow_handle(name)
    try:
        return cluster.loop.run(h.query(QUERY_PROGRESS))
    except RPCError:
        return None


def code_text(page, locator):
    """The JSON a CodeMirror view of the UI shows, without its fold markers.
    The page is tall enough for CodeMirror to draw every line."""
    lines = [ln for ln in page.locator(locator).inner_text().splitlines() if ln.strip() not in ("⌄", "›", "")]
    return json.loads("\n".join(lines))


def test_the_web_ui_shows_a_running_run_as_its_progress_query_does(cluster, tmp_path):
    exe = chromium()
    out = artifacts()
    name = "web-ui-run"
    gate = str(tmp_path / "gate")
    trainer = TorchTrainer(linear_loop, train_loop_config={"epochs": 4, "gate": gate}, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name=name, verbose=0))
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("r", trainer.fit()), daemon=True)
    th.start()
    try:
        # Two epochs reported, the ranks held at the third; one of them killed: the run
        # has a failure and its new gang waits at the gate, so its progress holds still.
        wait_for("two epochs", lambda: (progress_of(cluster, name) or {}).get("epoch", 0) >= 2, timeout=180, every=0.2)
        os.kill(rank_pids("TORCHELASTIC_RUN_ID=" + name)[-1], signal.SIGKILL)
        wait_for("the new gang restored", lambda: any(i["kind"] == "restored" for i in progress_of(cluster, name).get("incidents") or []),
                 timeout=180, every=0.2)
        wait_for("the run training again", lambda: progress_of(cluster, name)["state"] == "training", timeout=60, every=0.2)
        p = progress_of(cluster, name)
        assert p["failures"] == 1 and p["epoch"] == 2, p
        last = dict(p["metrics"][-1]["other"])

        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 6000})
            page.set_default_timeout(30000)
            page.goto("%s/namespaces/default/workflows/%s" % (cluster.ui, name))
            sync_api.expect(page.get_by_test_id("execution-status")).to_have_text(re.compile(r"^\s*running\s*$", re.I))  # CSS writes it in capitals
            sync_api.expect(page.get_by_test_id("workflow-id-heading")).to_contain_text(name)
            base = page.url.rsplit("/", 1)[0]  # .../workflows/<id>/<run id>
            page.screenshot(path=os.path.join(out, "1-history.png"))

            # Current details: the state, the epoch, what the run reported, its failure.
            page.goto(base + "/user-metadata")
            # The UI draws the markdown of the current details in a sandboxed frame.
            details = page.frame_locator("iframe").first.locator("body")
            sync_api.expect(details).to_contain_text("training · epoch 2 ·")
            text = details.inner_text()
            assert "loss %.4g" % last["loss"] in text and "1 failures, 0 preemptions" in text, text
            assert "accuracy" not in text and "epoch 1" not in text, text  # the program reported no accuracy
            assert "(2 ranks)" in text, text
            page.screenshot(path=os.path.join(out, "2-current-details.png"))

            # Memo and search attributes.
            page.goto(base + "/metadata")
            sync_api.expect(page.get_by_text("DurabletrainState")).to_be_visible()
            body = page.inner_text("main") if page.locator("main").count() else page.inner_text("body")
            sa_text, memo_text = body.split("Search Attributes", 2)[-1].split("Memo", 1)
            sa, memo = loads_shown(sa_text), loads_shown(memo_text)
            assert sa["DurabletrainState"] == p["state"] and sa["DurabletrainEpoch"] == p["epoch"], sa
            fields = memo.get("fields", memo)
            assert fields["epoch"] == p["epoch"] and fields["failures"] == p["failures"] == 1, fields
            assert fields["incidents"] == len(p["incidents"]) + p.get("incidents_dropped", 0), (fields, p["incidents"])
            assert fields["metrics"] == last and "epochs" not in fields, fields  # a program's own loop: no epoch count
            page.screenshot(path=os.path.join(out, "3-metadata.png"))

            # The progress query, run from the Queries tab.
            page.goto(base + "/query")
            page.locator('[data-menu-anchor="query-select-select"] button').click()
            page.locator('ul[aria-labelledby="query-select-select"] li', has_text="progress").first.click()
            page.get_by_role("button", name="Run Query").click()
            sync_api.expect(page.get_by_test_id("query-result")).to_contain_text('"state"')
            shown = code_text(page, '[data-testid="query-result"]')
            now = progress_of(cluster, name)
            for k in ("state", "epoch", "epochs", "failures", "preemptions", "incidents", "metrics", "latest_checkpoint", "generation"):
                assert shown.get(k) == now.get(k), "%s: the UI shows %r; the progress query answers %r" % (k, shown.get(k), now.get(k))
            page.screenshot(path=os.path.join(out, "4-progress-query.png"))

            # A list of runs by search attribute holds it.
            q = 'WorkflowId="%s" AND DurabletrainState="training" AND DurabletrainEpoch=2' % name
            page.goto("%s/namespaces/default/workflows?query=%s" % (cluster.ui, urllib.parse.quote(q)))
            sync_api.expect(page.get_by_role("link", name=name).first).to_be_visible()
            page.screenshot(path=os.path.join(out, "5-list.png"))
            browser.close()
    finally:
        open(gate, "w").close()
    th.join(180)
    assert not th.is_alive()
    r = result["r"]
    assert r.state == "completed" and r.failures == 1, r.progress


def loads_shown(text):
    """A JSON value as the UI's code view shows it (fold markers dropped)."""
    lines = [ln for ln in text.splitlines() if ln.strip() not in ("⌄", "›", "")]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("{"))
    depth, end = 0, None
    for i in range(start, len(lines)):
        depth += lines[i].count("{") - lines[i].count("}")
        if depth == 0:
            end = i
            break
    return json.loads("\n".join(lines[start:end + 1]))
