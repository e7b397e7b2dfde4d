"""Per-benchmark and suite verdicts: PASS, FAIL or INCONCLUSIVE from an interval and a threshold."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from inferlab.errors import UsageError
from inferlab.suite.gate.load import Run, check_comparable
from inferlab.suite.gate.stats import (
    DEFAULT_RUN_NOISE, bonferroni_level, bootstrap_log_ratios, log_median, log_ratio, percentile_interval, replicates_for,
)
from inferlab.suite.gate.thresholds import DEFAULT_THRESHOLD, threshold_for

PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"


EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}



def verdict(ci_low: float, ci_high: float, threshold: float) -> str:
    """PASS if high < 1 + t; FAIL if low > 1 (and high >= 1 + t); else INCONCLUSIVE."""
    if ci_high < 1 + threshold:
        return PASS
    if ci_low > 1:
        return FAIL
    return INCONCLUSIVE



def suite_verdict(verdicts: Sequence[str]) -> str:
    """FAIL if any FAIL, else INCONCLUSIVE if any, else PASS."""
    if FAIL in verdicts:
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS



@dataclass(frozen=True)
class Row:
    """One benchmark's comparison: the raw rounds (ms) of every run on each side, and what follows."""

    fullname: str
    name: str
    metric: str
    base_rounds_ms: tuple[tuple[float, ...], ...]
    head_rounds_ms: tuple[tuple[float, ...], ...]
    ratio: float
    ci_low: float
    ci_high: float
    threshold: float
    verdict: str

    @property
    def base_median_ms(self) -> float:
        """exp(mean_r log m_r) over base runs: the median itself with one run."""
        return math.exp(np.mean([log_median(r) for r in self.base_rounds_ms]))

    @property
    def head_median_ms(self) -> float:
        return math.exp(np.mean([log_median(r) for r in self.head_rounds_ms]))



@dataclass(frozen=True)
class Report:
    """Every row and the settings that produced them."""

    rows: tuple[Row, ...]
    confidence: float
    run_noise: float
    level: float  # per benchmark, after Bonferroni
    replicates: int
    seed: int
    thresholds: Mapping[str, float]
    base_paths: tuple[str, ...]
    head_paths: tuple[str, ...]

    @property
    def k(self) -> int:
        return len(self.rows)

    @property
    def verdict(self) -> str:
        return suite_verdict([row.verdict for row in self.rows])

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def counts(self) -> dict[str, int]:
        return {v: sum(row.verdict == v for row in self.rows) for v in (FAIL, INCONCLUSIVE, PASS)}



def compare(
    base_runs: Sequence[Run], head_runs: Sequence[Run], thresholds: Mapping[str, float] | None = None,
    confidence: float = 0.95, run_noise: float = DEFAULT_RUN_NOISE, seed: int = 0,
) -> Report:
    """Ratio, Bonferroni interval and verdict for every benchmark (see the module docstring)."""
    thresholds = dict(thresholds or {"default": DEFAULT_THRESHOLD})
    _check_settings(confidence, run_noise)
    check_comparable(base_runs, head_runs)
    names = base_runs[0].names
    _check_threshold_metrics(thresholds, {base_runs[0].get(n).metric for n in names})
    level = bonferroni_level(confidence, len(names))
    replicates = replicates_for(level)
    rows = tuple(
        _row(name, base_runs, head_runs, thresholds, level, replicates, run_noise, seed) for name in names
    )
    return Report(rows, confidence, run_noise, level, replicates, seed, MappingProxyType(thresholds),
                  tuple(str(r.path) for r in base_runs), tuple(str(r.path) for r in head_runs))



def _check_settings(confidence: float, run_noise: float) -> None:
    # Below 0.5 a two-sided interval no longer covers the estimate's own uncertainty: a FAIL would mean little.
    if not 0.5 <= confidence < 1:
        raise UsageError(f"confidence must be in [0.5, 1), got {confidence}: use e.g. 0.95")
    if not (run_noise >= 0 and math.isfinite(run_noise)):
        raise UsageError(f"run noise must be a fraction >= 0, got {run_noise}: use e.g. 0.01 for 1%")



def _check_threshold_metrics(thresholds: Mapping[str, float], metrics: set[str]) -> None:
    unknown = sorted(m for m in thresholds if m != "default" and m not in metrics)
    if unknown:
        raise UsageError(f"--threshold names {', '.join(unknown)}, which no benchmark measures "
                         f"(these measure {', '.join(sorted(metrics))}): fix the metric name")



def _row(name: str, base_runs: Sequence[Run], head_runs: Sequence[Run], thresholds: Mapping[str, float],
         level: float, replicates: int, run_noise: float, seed: int) -> Row:
    series = base_runs[0].get(name)
    base = [run.get(name).rounds_ms for run in base_runs]
    head = [run.get(name).rounds_ms for run in head_runs]
    # Seeded by the name too: a benchmark's interval does not depend on which others are compared.
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    low, high = percentile_interval(bootstrap_log_ratios(base, head, replicates, run_noise, rng), level)
    threshold = threshold_for(series.metric, thresholds)
    return Row(name, series.name, series.metric, tuple(base), tuple(head), math.exp(log_ratio(base, head)),
               low, high, threshold, verdict(low, high, threshold))
