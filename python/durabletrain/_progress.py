"""Following a run as a person would: a line per report and per incident
in a terminal; in Jupyter, one live table that updates in place."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "%.4g" % v
    return str(v)


class Follower:
    def __init__(self, name: str, verbose: int = 1, attached: Optional[str] = None, ui: Optional[str] = None) -> None:
        self.name, self.verbose, self.ui = name, verbose, ui
        self.seen_metrics = 0
        self.seen_incidents = 0
        self.state = None
        self.notebook = verbose > 0 and _in_notebook()
        self.rows: List[Dict[str, Any]] = []
        self.events: List[str] = []
        self.handle = None
        if verbose:
            how = {"running": "attached to the running run", "ended": "the run had ended; its result"}.get(attached or "", "started")
            self._say("durabletrain: %s %s%s" % (how, name, " (Web UI: %s/namespaces/default/workflows/%s)" % (ui, name) if ui else ""))

    def _say(self, line: str) -> None:
        if self.notebook:
            self.events.append(line)
            self._draw()
        else:
            print(line, file=sys.stderr, flush=True)

    def update(self, p: Optional[Dict[str, Any]], final: bool = False) -> None:
        if not p or not self.verbose:
            return
        from durabletrain._driver import metrics_of
        metrics = p.get("metrics") or []
        dropped = p.get("metrics_dropped", 0)
        for m in metrics[max(0, self.seen_metrics - dropped):]:
            row = metrics_of(m)
            self.rows.append(row)
            if not self.notebook:
                self._say("durabletrain: %s iteration %d: %s" % (self.name, row["training_iteration"],
                                                               ", ".join("%s=%s" % (k, _fmt(v)) for k, v in row.items() if k != "training_iteration")))
        self.seen_metrics = dropped + len(metrics)
        incidents = p.get("incidents") or []
        idrop = p.get("incidents_dropped", 0)
        for inc in incidents[max(0, self.seen_incidents - idrop):]:
            self._say("durabletrain: %s %s (gang %s, epoch %s): %s" % (self.name, inc.get("kind"), inc.get("generation"), inc.get("epoch"), inc.get("detail")))
        self.seen_incidents = idrop + len(incidents)
        state = p.get("state")
        if state != self.state:
            self.state = state
            if state in ("completed", "failed", "stopped", "cancelled") or not final:
                self._say("durabletrain: %s is %s (%d/%s ranks, %d failures, %d preemptions)" % (
                    self.name, state, p.get("world", 0), p.get("workers", "?"), p.get("failures", 0), p.get("preemptions", 0)))
        if self.notebook:
            self._draw()

    def _draw(self) -> None:
        from IPython.display import HTML, display
        cols: List[str] = []
        for r in self.rows:
            for k in r:
                if k not in cols:
                    cols.append(k)
        head = "".join("<th>%s</th>" % c for c in cols)
        body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % _fmt(r.get(c, "")) for c in cols) for r in self.rows[-20:])
        html = "<div><b>%s</b> &mdash; %s<table><tr>%s</tr>%s</table>%s<pre>%s</pre></div>" % (
            self.name, self.state or "starting", head, body, self._plot(), "\n".join(self.events[-10:]))
        if self.handle is None:
            self.handle = display(HTML(html), display_id=True)
        else:
            self.handle.update(HTML(html))

    def _plot(self) -> str:
        """The curves of every metric against training_iteration, as an
        inline PNG, where matplotlib is installed; else nothing."""
        if len(self.rows) < 2:
            return ""
        try:  # the figure API alone: pyplot would install itself into the notebook's kernel
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError:
            return ""
        import base64
        import io
        names = [k for k in self.rows[-1] if k != "training_iteration" and isinstance(self.rows[-1][k], (int, float))][:6]
        if not names:
            return ""
        fig = Figure(figsize=(3.2 * len(names), 2.4))
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, len(names), squeeze=False)
        xs = [r["training_iteration"] for r in self.rows]
        for ax, name in zip(axes[0], names):
            ax.plot(xs, [r.get(name, float("nan")) for r in self.rows], marker=".")
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("training_iteration", fontsize=8)
            ax.tick_params(labelsize=7)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        return '<img alt="metrics" src="data:image/png;base64,%s"/>' % base64.b64encode(buf.getvalue()).decode()

    def ask_stop(self) -> bool:
        """Ctrl-C: stop the run, or leave it running? (No terminal: leave it.)"""
        if not sys.stdin or not sys.stdin.isatty():
            return False
        try:
            answer = input("\ndurabletrain: stop %s (it checkpoints and ends), or leave it running? [s=stop / Enter=leave] " % self.name)
        except (EOFError, KeyboardInterrupt):
            return False
        return answer.strip().lower() in ("s", "stop", "y", "yes")
