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


def saved_run(rounds_ms: dict, *, node: str, device_name: str, when: str, commit: str, model: str = "tiny-random",
              dtype: str = "fp32", engine: str = "eager") -> dict:
    """A run as pytest-benchmark saves it with --benchmark-save-data and the inferlab plugin: one
    entry per case id -> its rounds in ms (raw rounds kept), on a CPU machine named `node`."""
    entries = []
    for case, rounds in rounds_ms.items():
        data = [float(r) / 1e3 for r in rounds]
        stats = {"min": min(data), "max": max(data), "mean": float(np.mean(data)), "median": float(np.median(data)),
                 "rounds": len(data), "iterations": 1, "data": data}
        entries.append({
            "group": None, "name": f"test_decode[{case}]", "fullname": f"perf_tests/test_x.py::test_decode[{case}]",
            "params": {"case": case}, "param": case, "options": {"disable_gc": True},
            "extra_info": {"metric": case.rsplit("-", 1)[1], "fingerprint": {"model": model, "dtype": dtype, "engine": engine}},
            "stats": stats,
        })
    machine = {"device_type": "cpu", "device_name": device_name, "device_count": 1, "driver": None, "cuda": None,
               "torch": "2.x", "transformers": "5.x", "model": model, "dtype": dtype, "layout": "single"}
    return {"machine_info": {"node": node, "inferlab": machine}, "commit_info": {"id": commit, "time": when},
            "benchmarks": entries, "datetime": when, "version": "5.3.1"}


def synthetic_history(levels, seed: int, case: str = "eager-b1-p16-n32-tpot_ms", median_ms: float = 1.3,
                      run_shift: float = 0.003, round_noise: float = 0.01, rounds: int = 20, node: str = "runner-1",
                      device_name: str = "Test CPU") -> list[dict]:
    """One saved run per level (the true median is median_ms x level): a N(0, run_shift) shift per
    run and N(0, round_noise) per round, from a seeded generator; hourly datetimes, commits c000..."""
    rng = np.random.default_rng(seed)
    runs = []
    for i, level in enumerate(levels):
        shift = np.exp(rng.normal(0.0, run_shift))
        when = f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00"
        samples = median_ms * level * shift * np.exp(rng.normal(0.0, round_noise, rounds))
        runs.append(saved_run({case: list(samples)}, node=node, device_name=device_name, when=when,
                              commit=f"c{i:03d}"))
    return runs

