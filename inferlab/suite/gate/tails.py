"""Tail verdicts: p99 of TPOT (a TPOT entry's rounds) and of ITL (its saved gaps), head against base.

Each (benchmark, metric, stat) is one more verdict in the gate's family, judged by the same rule
as the medians (`verdict`) with the threshold named `<metric>.<stat>` (e.g. ``tpot_ms.p99=10%``),
else the metric's own, else the default one.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from inferlab.suite.gate.extras import Extras, itl_requests
from inferlab.suite.gate.load import Run
from inferlab.suite.gate.quantiles import as_matrix, mean_log_quantile, resampled_mean_log_quantile, tail_fraction
from inferlab.suite.gate.stats import percentile_interval
from inferlab.suite.gate.thresholds import threshold_for
from inferlab.suite.gate.verdict import verdict

TAIL_METRICS = ("tpot_ms", "itl_ms")  # judged on entries whose metric is tpot_ms


@dataclass(frozen=True)
class TailRow:
    """One tail comparison: geometric means over runs of each run's quantile (ms), ratio, interval, verdict."""

    fullname: str
    name: str
    metric: str
    stat: str
    base_ms: float
    head_ms: float
    ratio: float
    ci_low: float
    ci_high: float
    threshold: float
    verdict: str


def tail_values(run: Run, extras: Extras, fullname: str, metric: str) -> np.ndarray | None:
    """[requests, values] of `metric` for one TPOT entry of one run, or None where it was not saved."""
    series = run.get(fullname)
    if series.metric != "tpot_ms":
        return None
    if metric == "tpot_ms":
        return as_matrix([[r] for r in series.rounds_ms])
    itl = itl_requests(extras, fullname)
    try:
        return None if itl is None else as_matrix(itl)
    except ValueError:
        return None


def planned_tails(runs: Sequence[tuple[Run, Extras]], stats: Sequence[str]) -> list[tuple[str, str, str]]:
    """(fullname, metric, stat) for every tail every run can show: TPOT entries, ITL where all runs saved gaps."""
    first = runs[0][0]
    planned = []
    for fullname in first.names:
        for metric in TAIL_METRICS:
            if all(tail_values(run, extras, fullname, metric) is not None for run, extras in runs):
                planned.extend((fullname, metric, stat) for stat in stats)
    return planned


def tail_threshold(metric: str, stat: str, thresholds: Mapping[str, float]) -> float:
    """thresholds['<metric>.<stat>'], else the metric's, else the default."""
    return thresholds.get(f"{metric}.{stat}", threshold_for(metric, thresholds))


def tail_row(
    fullname: str, metric: str, stat: str, base: Sequence[tuple[Run, Extras]], head: Sequence[tuple[Run, Extras]],
    thresholds: Mapping[str, float], level: float, replicates: int, run_noise: float, seed: int,
) -> TailRow:
    """Ratio of tails head / base, its hierarchical-bootstrap interval at `level`, and the verdict."""
    q = tail_fraction(stat)
    base_runs = [tail_values(run, extras, fullname, metric) for run, extras in base]
    head_runs = [tail_values(run, extras, fullname, metric) for run, extras in head]
    rng = np.random.default_rng([seed, zlib.crc32(f"{fullname}|{metric}|{stat}".encode())])
    draws = (resampled_mean_log_quantile(head_runs, q, replicates, run_noise, rng)
             - resampled_mean_log_quantile(base_runs, q, replicates, run_noise, rng))
    low, high = percentile_interval(draws, level)
    base_log, head_log = mean_log_quantile(base_runs, q), mean_log_quantile(head_runs, q)
    threshold = tail_threshold(metric, stat, thresholds)
    return TailRow(fullname, base[0][0].get(fullname).name, metric, stat, math.exp(base_log), math.exp(head_log),
                   math.exp(head_log - base_log), low, high, threshold, verdict(low, high, threshold))
