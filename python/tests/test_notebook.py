"""A notebook executed headless (nbclient, a real Jupyter kernel) calls
durabletrain.init() and fit(), and its output cells show the run's progress
and final metrics."""

import os

import pytest

pytest.importorskip("torch")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from conftest import REPO  # noqa: E402


def test_a_notebook_trains_and_shows_its_progress(cluster, tmp_path):
    nb = nbformat.read(os.path.join(REPO, "examples", "notebooks", "train_from_a_notebook.ipynb"), as_version=4)
    os.environ["RUN_NAME"] = "notebook-run"
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        os.environ.pop("RUN_NAME", None)
    fit_cell = nb.cells[3]
    text = []
    html = []
    for out in fit_cell.outputs:
        if out.output_type == "stream":
            text.append(out.text)
        elif out.output_type in ("display_data", "update_display_data", "execute_result"):
            html.append(out.data.get("text/html", ""))
    text = "".join(text)
    # The kernel joined the cluster this session started (DURABLETRAIN_HOME), and the live table shows every report.
    assert "final metrics {" in text and "'training_iteration': 5" in text, text
    assert html and "notebook-run" in html[-1] and "<th>acc</th>" in html[-1], html
    assert "completed" in html[-1], html[-1]
    assert '<img alt="metrics" src="data:image/png;base64,' in html[-1], "no plot of the curves in the live display"
    frame = nb.cells[4].outputs[0]
    assert frame.output_type == "execute_result" and "acc" in frame.data["text/plain"], frame
