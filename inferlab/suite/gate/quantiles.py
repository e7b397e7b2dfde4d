"""Tail statistics: a quantile (p99) of each run's rounds, with the gate's hierarchical bootstrap.

A run's tail is q_r = quantile(values of run r, q), linear interpolation (numpy's default). Two
kinds of values: a TPOT entry's rounds (one TPOT per request), and its inter-token gaps (ITL),
which the plugin saves per request in ``extra_info["itl_rounds_ms"]``. Requests are the
resampling unit inside a run (gaps of one request share its state), so a run is a matrix
[requests, values per request] and a replicate draws runs, then requests, then pools their values.

    log tail ratio = mean_r log q_r(head) - mean_r log q_r(base)

Interval: as for the median (see the package docstring), with the same run_noise term: a
run-to-run shift moves the whole distribution, tail included. Pure functions; no I/O.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from inferlab.errors import UsageError

# Largest number of values drawn at once: replicates are drawn in chunks below this.
CHUNK_VALUES = 2_000_000


_TAIL = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


def tail_fraction(stat: str) -> float:
    """'p99' -> 0.99; ValueError for anything that is not p<number> in (50, 100)."""
    match = _TAIL.match(stat)
    value = float(match.group(1)) / 100 if match else math.nan
    if not 0.5 < value < 1:
        raise ValueError(f"{stat!r} is not a tail percentile: write e.g. p99 or p95")
    return value


def parse_tails(text: str) -> tuple[str, ...]:
    """'p99' or 'p95,p99' -> the stats; 'none' -> (). UsageError naming the bad entry."""
    if text.strip().lower() == "none":
        return ()
    stats = tuple(part.strip() for part in text.split(","))
    for stat in stats:
        try:
            tail_fraction(stat)
        except ValueError as error:
            raise UsageError(f"--tails {text!r}: {error}, or none") from None
    if len(set(stats)) != len(stats):
        raise UsageError(f"--tails {text!r} names a percentile twice: give each once")
    return stats


def as_matrix(requests: Sequence[Sequence[float]]) -> np.ndarray:
    """[requests, values] from per-request value lists of equal length (TPOT: one value each)."""
    lengths = {len(r) for r in requests}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every request needs the same number (> 0) of values, got lengths {sorted(lengths)}")
    return np.asarray(requests, dtype=float)


def log_quantile(run: np.ndarray, q: float) -> float:
    """log(quantile(all values of one run, q))."""
    return float(np.log(np.quantile(run, q)))


def resampled_mean_log_quantile(
    runs: Sequence[np.ndarray], q: float, replicates: int, run_noise: float, rng: np.random.Generator
) -> np.ndarray:
    """[replicates] draws of mean_r log q_r: runs, then each run's requests, with replacement, + N(0, run_noise/sqrt(n))."""
    n = len(runs)
    picked = rng.integers(n, size=(replicates, n))
    logs = np.empty((replicates, n))
    for index, run in enumerate(runs):
        slots = np.flatnonzero(picked == index)  # flat indices into logs: every slot this run fills
        requests = run.shape[0]
        chunk = max(1, CHUNK_VALUES // run.size)
        for start in range(0, len(slots), chunk):
            filled = slots[start:start + chunk]
            draws = run[rng.integers(requests, size=(len(filled), requests))].reshape(len(filled), -1)
            logs.flat[filled] = np.log(np.quantile(draws, q, axis=1))
    return logs.mean(axis=1) + rng.normal(0.0, run_noise / math.sqrt(n), size=replicates)


def mean_log_quantile(runs: Sequence[np.ndarray], q: float) -> float:
    """mean_r log q_r: exp of it is the geometric mean of the runs' tails."""
    return float(np.mean([log_quantile(run, q) for run in runs]))
