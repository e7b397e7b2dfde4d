"""Sequential A/B verdicts: paired runs, looked at after every pair, with the error rate kept.

Unit: the pair. `inferlab ab` runs base and head interleaved (ABBA: base, head, head, base, ...),
so pair i holds one run of each side made side by side, and slow drift of the machine moves both.
Per benchmark, d_i = log m(head_i) - log m(base_i), m = the median of a run's rounds.

    ratio = exp(mean d),  interval = exp(mean d +- t_{n-1, 1-a/2} x sd(d) / sqrt(n))

a Student-t interval over the n pairs (it needs n >= 2; the run-to-run noise is measured by
sd(d), no prior is assumed). The verdict rule is the gate's: PASS if high < 1 + t, FAIL if low > 1
(and high >= 1 + t), else INCONCLUSIVE, and the suite stops at the first decisive answer.

Peeking: looking after every pair and stopping when decisive would inflate false alarms if each
look used the level of a single test. Alpha spending by Bonferroni over the planned looks keeps
it: with L = max_pairs - min_pairs + 1 planned looks and k benchmarks, each interval has level
1 - (1 - c) / (k L). By the union bound, the chance that any interval at any look misses its true
ratio is <= 1 - c, whenever the sampling stops (stopping early only spends less).

Minimum detectable effect at n pairs (power 80%): exp((t_{n-1, 1-a/2} + t_{n-1, 0.8}) x sd(d) /
sqrt(n)) - 1. Run noise for single-run gates: sd(d) / sqrt(2), the spread of one run's log median
against its neighbour's, which is what the gate's run_noise term adds per side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy.stats import t as student_t

from inferlab.suite.gate.load import Run, check_comparable
from inferlab.suite.gate.stats import log_median
from inferlab.suite.gate.thresholds import threshold_for
from inferlab.suite.gate.verdict import EXIT_CODES, suite_verdict, verdict

POWER = 0.8


@dataclass(frozen=True)
class SequentialRow:
    """One benchmark after n pairs: ratio, interval, verdict, what the pairs can detect and their noise."""

    fullname: str
    name: str
    metric: str
    pairs: int
    ratio: float
    ci_low: float
    ci_high: float
    threshold: float
    verdict: str
    mde: float  # smallest slowdown (fraction) detected with 80% power at this n and level
    run_noise: float  # sd(d) / sqrt(2)


@dataclass(frozen=True)
class Look:
    """Every benchmark's row at one look, and the level each interval had."""

    rows: tuple[SequentialRow, ...]
    level: float
    planned_looks: int

    @property
    def verdict(self) -> str:
        return suite_verdict([row.verdict for row in self.rows])

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def decisive(self) -> bool:
        return self.verdict != "INCONCLUSIVE"


def look_level(confidence: float, k: int, planned_looks: int) -> float:
    """1 - (1 - confidence) / (k x planned_looks): Bonferroni over benchmarks and looks."""
    return 1 - (1 - confidence) / (k * planned_looks)


def _t(p: float, df: int) -> float:
    return float(student_t.ppf(p, df))


def pair_differences(base: Sequence[Sequence[float]], head: Sequence[Sequence[float]]) -> np.ndarray:
    """d_i = log median(head_i) - log median(base_i), for each pair i."""
    assert len(base) == len(head), "one base and one head run per pair"
    return np.asarray([log_median(h) - log_median(b) for b, h in zip(base, head)])


def paired_interval(d: np.ndarray, level: float) -> tuple[float, float, float]:
    """(ratio, low, high): exp of mean d and of its Student-t interval at `level`; needs >= 2 pairs."""
    n = len(d)
    if n < 2:
        raise ValueError(f"a paired interval needs at least 2 pairs, got {n}")
    half = _t((1 + level) / 2, n - 1) * float(np.std(d, ddof=1)) / math.sqrt(n)
    mean = float(np.mean(d))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def minimum_detectable_effect(d: np.ndarray, level: float, power: float = POWER) -> float:
    """exp((t_{1-a/2} + t_{power}) x sd(d) / sqrt(n)) - 1, t with n - 1 degrees of freedom."""
    n = len(d)
    return math.expm1((_t((1 + level) / 2, n - 1) + _t(power, n - 1)) * float(np.std(d, ddof=1)) / math.sqrt(n))


def look(base_runs: Sequence[Run], head_runs: Sequence[Run], thresholds: Mapping[str, float], confidence: float,
         planned_looks: int) -> Look:
    """Every benchmark's paired verdict after len(base_runs) == len(head_runs) pairs."""
    check_comparable(base_runs, head_runs)
    names = base_runs[0].names
    level = look_level(confidence, len(names), planned_looks)
    rows = []
    for name in names:
        d = pair_differences([r.get(name).rounds_s for r in base_runs], [r.get(name).rounds_s for r in head_runs])
        ratio, low, high = paired_interval(d, level)
        series = base_runs[0].get(name)
        threshold = threshold_for(series.metric, thresholds)
        rows.append(SequentialRow(name, series.name, series.metric, len(d), ratio, low, high, threshold,
                                  verdict(low, high, threshold), minimum_detectable_effect(d, level),
                                  float(np.std(d, ddof=1)) / math.sqrt(2)))
    return Look(tuple(rows), level, planned_looks)
