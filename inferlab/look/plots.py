"""PNG plots of a sweep: TTFT, TPOT, total latency and output tokens/s against output length.

One line per (engine, prompt length, batch size); each point is the p50 over runs, with an
error bar from p5 to p95 of the same runs. Figures are drawn with matplotlib's Agg canvas
directly (no pyplot, no global backend switch), and written atomically, never over a file.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from inferlab import storage
from inferlab.measure.bench import BenchResult
from inferlab.suite.sweep import series_key

# (file name, y label, RunTimes property giving one value per run)
PLOTS = (
    ("ttft.png", "TTFT (ms)", "ttft_ms"),
    ("tpot.png", "TPOT (ms)", "tpot_ms"),
    ("e2e.png", "total latency (ms)", "e2e_ms"),
    ("output_tokens_per_s.png", "output tokens/s per sequence", "output_tokens_per_s"),
)


def series(results: Sequence[BenchResult], metric: str) -> dict[tuple[str, int, int], list[tuple[int, float, float, float]]]:
    """Per line, (N, p5, p50, p95) of `metric` over runs, sorted by N; failed results are left out."""
    lines: dict[tuple[str, int, int], list[tuple[int, float, float, float]]] = {}
    for result in results:
        values = [getattr(r, metric) for r in result.runs]
        values = [v for v in values if v is not None]
        if result.status != "ok" or not values:
            continue
        p5, p50, p95 = (float(v) for v in np.percentile(values, (5, 50, 95)))
        lines.setdefault(series_key(result), []).append((result.config.output_length, p5, p50, p95))
    return {key: sorted(points) for key, points in lines.items()}


def draw(results: Sequence[BenchResult], ylabel: str, metric: str, title: str) -> Figure:
    """One figure: `metric` against output length, a line with p5-p95 bars per series."""
    figure = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for (engine, prompt, batch), points in series(results, metric).items():
        n, p5, p50, p95 = (np.array(column) for column in zip(*points))
        axes.errorbar(n, p50, yerr=[p50 - p5, p95 - p50], marker="o", capsize=3, label=f"{engine} P={prompt} B={batch}")
    axes.set_xlabel("output length N (tokens)")
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    if axes.lines:
        axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def png_bytes(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def write_plots(results: Sequence[BenchResult], folder: Path, title: str) -> tuple[Path, ...]:
    """The four PNGs in `folder`; returns their paths."""
    paths = []
    for name, ylabel, metric in PLOTS:
        figure = draw(results, ylabel, metric, f"{title}: p50, bars p5-p95")
        paths.append(storage.write_bytes_atomic(Path(folder) / name, png_bytes(figure)))
    return tuple(paths)
