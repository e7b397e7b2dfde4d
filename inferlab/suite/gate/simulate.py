"""The gate's rules on synthetic runs whose true slowdown and noise are known: how often each one FAILs.

Used to choose and document the verdict rule (see the package docstring): the gate's interval
rule, the point-estimate rule, and what ``--benchmark-compare-fail=median:X%`` would decide.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from inferlab.suite.gate.load import Run, Series
from inferlab.suite.gate.stats import pytest_benchmark_style
from inferlab.suite.gate.verdict import FAIL, INCONCLUSIVE, PASS, Row, compare


def point_rule(row: Row) -> str:
    """The alternative rule: FAIL if low > 1 and ratio >= 1 + t; PASS if high < 1 + t; else INCONCLUSIVE."""
    if row.ci_low > 1 and row.ratio >= 1 + row.threshold:
        return FAIL
    return PASS if row.ci_high < 1 + row.threshold else INCONCLUSIVE


def synthetic_run(rng: np.random.Generator, slowdown: float, entries: int, rounds: int, within: float,
                  run_noise: float) -> Run:
    """A run of `entries` benchmarks of 1 ms x (1 + slowdown): one N(0, run_noise) shift per benchmark, N(0, within) per round."""
    series = []
    for index in range(entries):
        shift = rng.normal(0.0, run_noise)
        rounds_s = 1e-3 * (1 + slowdown) * np.exp(shift + rng.normal(0.0, within, rounds))
        series.append(Series(f"sim::tpot[{index}]", f"tpot[{index}]", "tpot_ms", tuple(rounds_s), {}))
    return Run(Path(f"synthetic-{slowdown}"), {}, tuple(series))


def simulate(pairs: int, threshold: float, confidence: float, run_noise: float, within: float, rounds: int,
             entries: int = 4, seed: int = 0) -> dict:
    """Per true slowdown: per-entry FAIL / INCONCLUSIVE rates of each rule when run_noise is known exactly."""
    rng = np.random.default_rng(seed)
    results = {}
    for slowdown in (0.0, threshold / 2, threshold, 2 * threshold):
        verdicts = {"pytest-benchmark median": [], "gate": [], "point rule": []}
        for _ in range(pairs):
            base = synthetic_run(rng, 0.0, entries, rounds, within, run_noise)
            head = synthetic_run(rng, slowdown, entries, rounds, within, run_noise)
            verdicts["pytest-benchmark median"] += [FAIL if f else PASS
                                                    for f in pytest_benchmark_style(base, head, threshold).values()]
            rows = compare([base], [head], {"default": threshold}, confidence=confidence, run_noise=run_noise).rows
            verdicts["gate"] += [row.verdict for row in rows]
            verdicts["point rule"] += [point_rule(row) for row in rows]
        results[f"{100 * slowdown:g}%"] = {
            method: {v: found.count(v) / len(found) for v in (FAIL, INCONCLUSIVE, PASS)}
            for method, found in verdicts.items()
        }
    return {"pairs": pairs, "entries": entries, "rounds": rounds, "within_round_noise": within, "run_noise": run_noise,
            "threshold": threshold, "confidence": confidence, "rates": results}
