"""The gate's statistics: log medians per run, the hierarchical bootstrap, Bonferroni levels, run noise.

Pure functions of raw round times; no I/O, no formatting.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from inferlab.errors import UsageError
from inferlab.suite.gate.load import Run, check_comparable

DEFAULT_RUN_NOISE = 0.01


MIN_REPLICATES = 4000


TAIL_REPLICATES = 20


# Rounds drawn at once: memory stays about 64 MB however many rounds and replicates (the draws
# come from the generator in the same order, so chunking does not change a single value).
CHUNK_DRAWS = 2**22



def log_median(rounds: Sequence[float]) -> float:
    """log(median(rounds)) of one run."""
    return float(np.log(np.median(rounds)))



def log_ratio(base: Sequence[Sequence[float]], head: Sequence[Sequence[float]]) -> float:
    """mean_r log m_r(head) - mean_r log m_r(base), m_r = median of run r's rounds."""
    return float(np.mean([log_median(r) for r in head]) - np.mean([log_median(r) for r in base]))



def resampled_mean_log_median(
    runs: Sequence[Sequence[float]], replicates: int, run_noise: float, rng: np.random.Generator
) -> np.ndarray:
    """[replicates] draws of mean_r log m_r: runs, then each run's rounds, drawn with replacement, + N(0, run_noise/sqrt(n))."""
    n = len(runs)
    picked = rng.integers(n, size=(replicates, n))  # which run fills each of the n slots
    logs = np.empty((replicates, n))
    for index, rounds in enumerate(runs):
        rounds = np.asarray(rounds, dtype=float)
        slots = picked == index
        logs[slots] = _resampled_log_medians(rounds, int(slots.sum()), rng)
    return logs.mean(axis=1) + rng.normal(0.0, run_noise / math.sqrt(n), size=replicates)



def _resampled_log_medians(rounds: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """[count] log medians of `rounds` drawn with replacement, at most CHUNK_DRAWS rounds at a time."""
    rows = max(1, CHUNK_DRAWS // len(rounds))
    out = np.empty(count)
    for start in range(0, count, rows):
        stop = min(count, start + rows)
        out[start:stop] = np.log(np.median(rounds[rng.integers(len(rounds), size=(stop - start, len(rounds)))], axis=1))
    return out



def bootstrap_log_ratios(
    base: Sequence[Sequence[float]], head: Sequence[Sequence[float]], replicates: int, run_noise: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """[replicates] hierarchical-bootstrap draws of the log ratio head / base."""
    base_draws = resampled_mean_log_median(base, replicates, run_noise, rng)
    return resampled_mean_log_median(head, replicates, run_noise, rng) - base_draws



def bonferroni_level(confidence: float, k: int) -> float:
    """Per-benchmark two-sided level 1 - (1 - confidence) / k."""
    return 1 - (1 - confidence) / k



def replicates_for(level: float) -> int:
    """max(4000, ceil(20 / tail)), tail = (1 - level) / 2: each tail keeps >= 20 replicates."""
    return max(MIN_REPLICATES, math.ceil(TAIL_REPLICATES / ((1 - level) / 2) - 1e-9))



def percentile_interval(log_ratios: np.ndarray, level: float) -> tuple[float, float]:
    """exp of the (1-level)/2 and (1+level)/2 quantiles: the interval of the ratio."""
    low, high = np.quantile(log_ratios, [(1 - level) / 2, (1 + level) / 2])
    return math.exp(low), math.exp(high)



def estimate_run_noise(runs: Sequence[Run]) -> dict[str, float]:
    """Per benchmark, the std (ddof=1) of log m_r across >= 2 runs of the same code: a value for run_noise.

    It includes the within-run noise of each median as well as the run-to-run shift, so it is an
    upper estimate; with several benchmarks take the largest (or that of the metric you gate).
    """
    if len(runs) < 2:
        raise UsageError(f"estimating run noise needs at least 2 runs of the same code, got {len(runs)}: repeat the run")
    check_comparable(runs[:1], runs[1:])
    return {name: float(np.std([log_median(run.get(name).rounds_s) for run in runs], ddof=1)) for name in runs[0].names}


CALIBRATION_CONFIDENCE = 0.95


def noise_upper_bound(noise: float, df: int, confidence: float = CALIBRATION_CONFIDENCE) -> float:
    """One-sided upper confidence bound of a standard deviation estimated as `noise` with `df` degrees
    of freedom: noise x sqrt(df / chi2_{1 - confidence}(df)) (normal data).

    A spread estimated from a few runs is below the true one about half the time, and a gate
    given a run_noise below the truth raises false alarms. The bound is what a calibration
    hands the gate: x15.9 over 2 runs (df 1), x2.3 over 5, x1.8 over 8, x1.4 over 20.
    """
    from scipy.stats import chi2

    if df < 1:
        raise UsageError(f"a spread needs at least 1 degree of freedom (2 runs), got {df}")
    if not 0 < confidence < 1:
        raise UsageError(f"confidence must lie between 0 and 1, got {confidence}")
    return float(noise * math.sqrt(df / chi2.ppf(1 - confidence, df)))


def calibrated_run_noise(runs: Sequence[Run], confidence: float = CALIBRATION_CONFIDENCE) -> dict[str, float]:
    """Per benchmark, the upper confidence bound of `estimate_run_noise` over len(runs) - 1 degrees of freedom."""
    return {name: noise_upper_bound(noise, len(runs) - 1, confidence) for name, noise in estimate_run_noise(runs).items()}



def pytest_benchmark_style(base_run: Run, head_run: Run, threshold: float) -> dict[str, bool]:
    """fullname -> True where --benchmark-compare-fail=median:X% fails: head median > base median x (1 + X)."""
    check_comparable([base_run], [head_run])
    return {
        name: float(np.median(head_run.get(name).rounds_s)) > float(np.median(base_run.get(name).rounds_s)) * (1 + threshold)
        for name in base_run.names
    }
