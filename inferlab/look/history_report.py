"""`inferlab history` output: a text table per machine, JSON, and one PNG per benchmark trail.

Plots are drawn on matplotlib's Agg canvas (no pyplot) and written atomically, never over a file.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from inferlab import storage
from inferlab.suite.history import TrailReport


def _percent(value: float) -> str:
    return f"{100 * value:+.2f}%"


def format_history(reports: Sequence[TrailReport]) -> str:
    """Per machine: one row per benchmark (runs, first and last median, trend, change points, drift)."""
    lines: list[str] = []
    header = ("benchmark", "metric", "runs", "first ms", "last ms", "trend/run", "change points", "drift", "budget")
    for machine in dict.fromkeys(r.trail.machine for r in reports):
        cells = []
        for r in (r for r in reports if r.trail.machine == machine):
            points = r.trail.points
            changes = ", ".join(f"run {c.index + 1}: {_percent(c.step)}" for c in r.changes) or "-"
            drift = _percent(r.drift.change) if r.drift else "-"
            budget = "-" if r.drift is None else (f"OVER {100 * r.drift.budget:.3g}%" if r.drift.over_budget
                                                  else f"within {100 * r.drift.budget:.3g}%")
            cells.append((r.trail.name, r.trail.metric, str(len(points)), f"{points[0].median_ms:.3f}",
                          f"{points[-1].median_ms:.3f}", _percent(r.trend), changes, drift, budget))
        widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
        lines.append(f"machine: {machine}")
        for row in [header, *cells]:
            lines.append("  ".join(c.ljust(w) if i in (0, 1, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        lines.append("")
    over = sum(1 for r in reports if r.drift and r.drift.over_budget)
    lines.append(f"history: {len(reports)} benchmark trail(s); {sum(len(r.changes) for r in reports)} change point(s); "
                 f"{over} over the drift budget. Drift = mean of the last runs against the reference run.")
    return "\n".join(lines)


def history_dict(reports: Sequence[TrailReport]) -> dict:
    """JSON-ready data, schema inferlab.history/1."""
    return {
        "schema": "inferlab.history/1",
        "trails": [
            {
                "machine": r.trail.machine, "fullname": r.trail.fullname, "name": r.trail.name, "metric": r.trail.metric,
                "runs": [{"path": p.path, "datetime": p.when, "commit": p.commit, "median_ms": p.median_ms} for p in r.trail.points],
                "trend_per_run": r.trend,
                "change_points": [{"index": c.index, "path": c.path, "commit": c.commit, "step": c.step} for c in r.changes],
                "drift": None if r.drift is None else {
                    "reference": r.drift.reference, "change": r.drift.change, "budget": r.drift.budget,
                    "window": r.drift.window, "largest_step": r.drift.largest_step, "over_budget": r.drift.over_budget},
            }
            for r in reports
        ],
    }


def plot_name(report: TrailReport, index: int) -> str:
    """A file name from the case id: safe characters only, numbered so two trails never share one."""
    return f"{index:03d}-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", report.trail.name)[:80] + ".png"


def plot_trail(report: TrailReport, path: Path) -> Path:
    """Median per run (ms) in order, segment levels between change points, and the drift budget line."""
    points = report.trail.points
    x = list(range(1, len(points) + 1))
    figure = Figure(figsize=(8, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot(x, [p.median_ms for p in points], "o-", markersize=3, label="median per run")
    for change in report.changes:
        axes.axvline(change.index + 0.5, color="tab:red", linestyle="--", linewidth=1)
        axes.annotate(_percent(change.step), (change.index + 0.5, points[change.index].median_ms), color="tab:red", fontsize=8)
    if report.drift is not None:
        reference = next(p for p in points if Path(p.path).resolve() == Path(report.drift.reference).resolve())
        axes.axhline(reference.median_ms, color="gray", linewidth=1, label="reference")
        axes.axhline(reference.median_ms * (1 + report.drift.budget), color="tab:orange", linewidth=1,
                     label=f"drift budget +{100 * report.drift.budget:.3g}%")
    axes.set_xlabel("run (in order)")
    axes.set_ylabel(f"{report.trail.metric} median (ms)")
    axes.set_title(f"{report.trail.name}\n{report.trail.machine}", fontsize=9)
    axes.legend(fontsize=8)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return storage.write_bytes_atomic(path, buffer.getvalue())
