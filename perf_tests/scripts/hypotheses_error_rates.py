"""How often the hypotheses' verdicts are wrong, on simulated sweeps with a known truth.

    PYTHONPATH=. python perf_tests/scripts/hypotheses_error_rates.py [--sweeps 200]

Each simulated sweep has output lengths 10/50/100/500 and 5 runs per length of an engine with
TTFT 17 ms and TPOT 14 ms, constant in N, scaled per run by host noise: "bimodal" (each run
either as fast or 45% slower, x N(1, 5%): eager engines on a GPU host) or "normal" (N(1, s)).
A "fall" makes the longest length decode that much slower, so tokens/s falls at its step.
Printed: the verdict counts of each hypothesis, and for "tokens/s plateaus" also those of the
earlier rule (the worst step alone against its 95% interval), for comparison.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import numpy as np

from inferlab.measure.metrics import RunTimes
from inferlab.suite import hypotheses

LENGTHS = (10, 50, 100, 500)


def sweep(seed: int, noise: str, spread: float, fall: float, repeats: int = 5) -> list[tuple[RunTimes, ...]]:
    rng = np.random.default_rng(seed)
    out = []
    for n in LENGTHS:
        if noise == "bimodal":
            factors = np.where(rng.random(repeats) < 0.5, 1.45, 1.0) * rng.normal(1.0, 0.05, repeats)
        else:
            factors = rng.normal(1.0, spread, repeats)
        tpot = 14.0 * (1 + fall * (n == LENGTHS[-1]))
        out.append(tuple(RunTimes(tuple(17.0 * f + tpot * f * i for i in range(n))) for f in factors))
    return out


def worst_step_rule(runs, seed: int) -> str:
    """The earlier rule: the minimum step of tokens/s, its 95% percentile interval above -5%."""
    values = [hypotheses.run_values(r) for r in runs]

    def worst(per_length):
        rates = per_length[..., hypotheses.RATE]
        return (rates[..., 1:] / rates[..., :-1] - 1).min(axis=-1)

    interval = hypotheses.bootstrap(values, worst, seed)
    return hypotheses.decide(interval, -hypotheses.FALL_TOLERANCE, np.inf)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=200)
    args = parser.parse_args()
    cases = [("bimodal", 0.0, 0.0), ("bimodal", 0.0, 0.3), ("normal", 0.02, 0.0), ("normal", 0.02, 0.2),
             ("normal", 0.05, 0.0), ("normal", 0.05, 0.2)]
    for noise, spread, fall in cases:
        counts = [Counter() for _ in range(3)]
        earlier = Counter()
        for seed in range(args.sweeps):
            runs = sweep(seed, noise, spread, fall)
            for count, verdict in zip(counts, hypotheses.check_all(LENGTHS, runs, seed=seed)):
                count[verdict.verdict] += 1
            earlier[worst_step_rule(runs, seed)] += 1
        label = f"{noise}{'' if noise == 'bimodal' else f' {100 * spread:.0f}%'}, fall {100 * fall:.0f}%"
        print(f"{label:22} linear {dict(counts[0])} | ttft {dict(counts[1])} | plateau {dict(counts[2])} "
              f"| plateau, worst step alone {dict(earlier)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
