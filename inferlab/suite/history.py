"""A benchmark's history across saved runs: trend, change points and drift against a pinned reference.

Input: saved pytest-benchmark runs (a `.benchmarks/` folder or a list of files). Runs are kept
apart by machine (node, device, model, dtype, layout: the gate's machine keys) and, within a
machine, each benchmark (fullname, metric, model/dtype/engine fingerprint) is one trail, its
runs in time order (pytest-benchmark's ``datetime``) or commit order (``commit_info["time"]``,
then ``datetime``). Each run gives one number, as in the gate: y = log median of its rounds.

- Trend: least-squares slope of y over the run index, as a fraction per run (exp(slope) - 1).
- Change points: ruptures' PELT with a least-squares (mean shift) cost on y, minimum segment 3
  runs, penalty PENALTY_FACTOR x sigma^2 x log(n) with sigma = 1.4826 x MAD(diff y) / sqrt(2), a
  robust run-noise estimate a step does not inflate. With factor 6, simulated on 30 runs: a flat
  series with 1% noise shows a false change point 2% of the time; a 3% step with 0.5% noise is
  found at the right run 99.5% of the time (with 1% noise: 97% within one run).
- Drift: against a pinned reference run (default: the trail's first), the current level is the
  mean of y over the last `window` runs; drift = exp(level - y_ref) - 1, over budget when it
  exceeds the budget. A chain of small slips that each pass a gate adds up here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import ruptures

from inferlab.errors import UsageError
from inferlab.suite.gate.extras import Extras, read_extras
from inferlab.suite.gate.load import FINGERPRINT_KEYS, MACHINE_KEYS, Run, load_run

PENALTY_FACTOR = 6.0


MIN_SEGMENT = 3


ORDERS = ("time", "commit")


@dataclass(frozen=True)
class Point:
    """One run of one benchmark: where it was saved, when, which commit, and its median (ms)."""

    path: str
    when: str
    commit: str
    median_ms: float

    @property
    def log_median(self) -> float:
        return math.log(self.median_ms)


@dataclass(frozen=True)
class Trail:
    """One benchmark on one machine, its runs in order."""

    machine: str
    fullname: str
    name: str
    metric: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class ChangePoint:
    """Runs from `index` on differ from those before: the level changed by `step` (a fraction)."""

    index: int
    path: str
    commit: str
    step: float


@dataclass(frozen=True)
class Drift:
    """Cumulative change of the last `window` runs against the reference run."""

    reference: str
    change: float
    budget: float
    window: int
    largest_step: float  # the largest run-to-run slowdown on the way, for contrast

    @property
    def over_budget(self) -> bool:
        return self.change > self.budget


def run_files(paths: Sequence[Path]) -> list[Path]:
    """Files as given; a folder stands for every *.json under it."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.json") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder: pass a .benchmarks folder or saved runs")
    if not files:
        raise UsageError(f"no saved runs (*.json) under {', '.join(map(str, paths))}: save runs with --benchmark-autosave --benchmark-save-data")
    return files


def load_runs(files: Sequence[Path]) -> tuple[list[tuple[Run, Extras]], list[Path]]:
    """(run, extras) for every file that is a saved run, and the files that are not (gate reports, say)."""
    runs, skipped = [], []
    for path in files:
        try:
            run = load_run(path)
        except UsageError:
            skipped.append(path)
            continue
        runs.append((run, read_extras(run)))
    if not runs:
        raise UsageError(f"none of the {len(files)} file(s) is a run saved with --benchmark-save-data")
    return runs, skipped


def machine_label(run: Run, extras: Extras) -> str:
    """node / device / model / dtype / layout: runs with different labels never share a trail."""
    parts = [extras.node or "?"] + [str(run.machine.get(key, "?")) for key in MACHINE_KEYS if key != "device_count"]
    return " / ".join(parts)


def order_key(extras: Extras, order: str) -> tuple[str, str]:
    """Sort key: the run's datetime, or its commit time first (ISO strings sort in time order)."""
    if order not in ORDERS:
        raise UsageError(f"order {order!r}: use one of {', '.join(ORDERS)}")
    commit_time = str(extras.commit.get("time") or "") if order == "commit" else ""
    return commit_time, extras.datetime


def trails(runs: Sequence[tuple[Run, Extras]], order: str = "time") -> list[Trail]:
    """Every (machine, benchmark) trail, its points in `order`."""
    ordered = sorted(runs, key=lambda item: (order_key(item[1], order), str(item[0].path)))
    grouped: dict[tuple, list] = {}
    for run, extras in ordered:
        machine = machine_label(run, extras)
        for series in run.series:
            fingerprint = tuple(str(series.fingerprint.get(k)) for k in FINGERPRINT_KEYS)
            key = (machine, series.fullname, series.metric, fingerprint)
            point = Point(str(run.path), extras.datetime, str(extras.commit.get("id") or ""), series.median_ms)
            grouped.setdefault(key, [series.name]).append(point)
    return [Trail(key[0], key[1], values[0], key[2], tuple(values[1:])) for key, values in grouped.items()]


def trend_per_run(log_medians: Sequence[float]) -> float:
    """exp(least-squares slope of log median over the run index) - 1; 0 for fewer than 2 runs."""
    if len(log_medians) < 2:
        return 0.0
    slope = np.polyfit(np.arange(len(log_medians)), np.asarray(log_medians), 1)[0]
    return math.expm1(slope)


def robust_sigma(log_medians: Sequence[float]) -> float:
    """1.4826 x MAD of first differences / sqrt(2): the run noise of y, unmoved by a few steps."""
    diffs = np.diff(np.asarray(log_medians, dtype=float))
    return float(1.4826 * np.median(np.abs(diffs - np.median(diffs))) / math.sqrt(2))


def change_indices(log_medians: Sequence[float], penalty_factor: float = PENALTY_FACTOR) -> list[int]:
    """Indices where a new segment starts (PELT, least-squares cost; see the module docstring)."""
    signal = np.asarray(log_medians, dtype=float).reshape(-1, 1)
    if len(signal) < 2 * MIN_SEGMENT:
        return []
    sigma = max(robust_sigma(log_medians), 1e-6)  # constant series: any real step is found
    penalty = penalty_factor * sigma**2 * math.log(len(signal))
    ends = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(signal).predict(pen=penalty)
    return [end for end in ends if end < len(signal)]


def change_points(trail: Trail, penalty_factor: float = PENALTY_FACTOR) -> list[ChangePoint]:
    """The trail's change points, each with the step between the medians of its neighbouring segments."""
    y = [p.log_median for p in trail.points]
    bounds = [0, *change_indices(y, penalty_factor), len(y)]
    found = []
    for before, start, after in zip(bounds, bounds[1:], bounds[2:]):
        step = math.expm1(float(np.median(y[start:after]) - np.median(y[before:start])))
        found.append(ChangePoint(start, trail.points[start].path, trail.points[start].commit, step))
    return found


def drift(trail: Trail, budget: float, reference: str | None = None, window: int = 3) -> Drift | None:
    """Drift of the trail's last `window` runs against `reference` (a run path; default its first run).

    None when the reference is not in this trail (another machine) or nothing follows it."""
    paths = [str(Path(p.path).resolve()) for p in trail.points]
    if reference is not None and str(Path(reference).resolve()) not in paths:
        return None
    start = paths.index(str(Path(reference).resolve())) if reference is not None else 0
    after = trail.points[start + 1:]
    if not after:
        return None
    y_ref = trail.points[start].log_median
    recent = [p.log_median for p in after[-window:]]
    y = [p.log_median for p in trail.points[start:]]
    largest = max(math.expm1(b - a) for a, b in zip(y, y[1:]))
    return Drift(trail.points[start].path, math.expm1(float(np.mean(recent)) - y_ref), budget, min(window, len(after)), largest)


@dataclass(frozen=True)
class TrailReport:
    """A trail with what was found in it."""

    trail: Trail
    trend: float
    changes: tuple[ChangePoint, ...]
    drift: Drift | None


def analyse(trail: Trail, budget: float, reference: str | None = None, window: int = 3,
            penalty_factor: float = PENALTY_FACTOR) -> TrailReport:
    """Trend, change points and drift of one trail."""
    y = [p.log_median for p in trail.points]
    return TrailReport(trail, trend_per_run(y), tuple(change_points(trail, penalty_factor)),
                       drift(trail, budget, reference, window))
