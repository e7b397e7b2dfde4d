"""How often the hypotheses' verdicts are wrong, on simulated sweeps with a known truth.

    PYTHONPATH=. python perf_tests/scripts/hypotheses_error_rates.py [--sweeps 200]
    PYTHONPATH=. python perf_tests/scripts/hypotheses_error_rates.py --top-up [--sweeps 1000] [--workers 2]
    PYTHONPATH=. python perf_tests/scripts/hypotheses_error_rates.py --paired [--sweeps 700] [--workers 2]

Each simulated sweep has output lengths 10/50/100/500 and runs per length of an engine whose
TTFT and TPOT are constant in N, scaled per run by host noise: "bimodal" (each run either as
fast or 45% slower, x N(1, 5%): eager engines on a GPU host), "normal" (N(1, s)) or "stalls"
(N(1, s), and one run in ten 2-4x slower, uniformly: a host stall on the 2-core CPU VM). A
"fall" makes the longest length decode that much slower, so tokens/s falls at its step; a
"growth" makes TPOT grow linearly in N by that much from the shortest to the longest length.

Default mode (5 runs per length, TTFT 17 ms, TPOT 14 ms): the verdict counts of each hypothesis,
and for "tokens/s plateaus" also those of the earlier rule (the worst step alone against its 95%
interval), for comparison.

--top-up (the CPU sweep's engine: TTFT 135 ms, TPOT 32.5 ms): each sweep draws `--max-runs` runs
per length, then is judged three ways: on the first `--runs` runs (fixed), on all of them
(fixed), and as `inferlab sweep` tops up (`inferlab.suite.top_up.judge_topped_up`: judged on
`--runs`, then one more run per length at a time while any verdict is INCONCLUSIVE, up to
`--max-runs`; the top-up budget is taken as unlimited), once with every look at 95% (what the
sweep does) and once with every look at 1 - 0.05 / looks (Bonferroni over the looks). Printed per
case and rule: the verdict counts of each hypothesis; the sweeps where a hypothesis that holds
got DOES NOT HOLD (and how many of those the first look, on `--runs` runs at 95%, had not
given); the sweeps where one that does not hold got HOLDS; the mean runs per length used.

--paired: the same engine and rules (fixed `--runs`, fixed `--max-runs`, topped up at 95% per
look), each judged with the runs independent (as a sweep without rounds) and paired by round (as
an interleaved sweep: run j of every length in round j), on the CPU VM's noises and on "phases":
each round, every length of it slowed by the same factor, 1.3 with chance 0.3 (the slow and fast
phases of the 2-core host, docs/perf/cpu/paired-rounds.md), besides the run's own noise. A "TTFT
growth" makes TTFT grow linearly in N by that much, against hypothesis 2's 10% tolerance.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from inferlab.measure.metrics import RunTimes
from inferlab.suite import hypotheses, top_up

LENGTHS = (10, 50, 100, 500)
NAMES = ("linear", "ttft", "plateau")


@dataclass(frozen=True)
class Case:
    """One simulated truth: the host's noise and what the engine does with N."""

    noise: str  # "bimodal", "normal" or "stalls"
    spread: float = 0.0  # the normal part's sd, as a fraction
    fall: float = 0.0  # extra TPOT at the longest length only
    growth: float = 0.0  # TPOT's growth from the shortest to the longest length, linear in N
    ttft_ms: float = 17.0
    tpot_ms: float = 14.0
    phases: float = 0.0  # each round's chance of being slow for all its lengths (x PHASE_SLOWDOWN)
    ttft_growth: float = 0.0  # TTFT's growth from the shortest to the longest length, linear in N

    @property
    def holds(self) -> tuple[bool, bool, bool]:
        """The truth of each hypothesis (linear, TTFT, plateau): a fall or a growth of TPOT breaks the
        linear one, and (beyond 5% at the step to N = 500) the plateau; a growth of TTFT the second."""
        violated = self.fall > 0 or self.growth > 0
        return not violated, self.ttft_growth == 0, not violated

    @property
    def label(self) -> str:
        noise = {"bimodal": "bimodal", "normal": f"N(1, {100 * self.spread:.0f}%)",
                 "stalls": f"N(1, {100 * self.spread:.0f}%) + 10% stalls x2-4"}[self.noise]
        noise += f", phases {100 * self.phases:.0f}% x{PHASE_SLOWDOWN}" if self.phases else ""
        truth = [f"fall {100 * self.fall:.0f}%"] if self.fall else []
        truth += [f"TPOT growth {100 * self.growth:.0f}%"] if self.growth else []
        truth += [f"TTFT growth {100 * self.ttft_growth:.0f}%"] if self.ttft_growth else []
        return f"{noise}, {', '.join(truth) or 'no effect'}"


PHASE_SLOWDOWN = 1.3


def factors(rng: np.random.Generator, case: Case, repeats: int) -> np.ndarray:
    """[repeats]: each run's slowdown under the case's host noise."""
    if case.noise == "bimodal":
        return np.where(rng.random(repeats) < 0.5, 1.45, 1.0) * rng.normal(1.0, 0.05, repeats)
    scale = rng.normal(1.0, case.spread, repeats)
    if case.noise == "stalls":
        scale = scale * np.where(rng.random(repeats) < 0.1, rng.uniform(2.0, 4.0, repeats), 1.0)
    return scale


def sweep(seed: int, case: Case, repeats: int = 5) -> list[tuple[RunTimes, ...]]:
    """Per output length, `repeats` runs of the case's engine under its host noise; run j of every
    length in round j, slowed with the others of its round where the case has phases."""
    rng = np.random.default_rng(seed)
    slow_rounds = np.random.default_rng([seed, 1]).random(repeats) < case.phases  # its own stream: the runs' stay
    round_factor = np.where(slow_rounds, PHASE_SLOWDOWN, 1.0)
    out = []
    for n in LENGTHS:
        along = (n - LENGTHS[0]) / (LENGTHS[-1] - LENGTHS[0])
        tpot = case.tpot_ms * (1 + case.growth * along) * (1 + case.fall * (n == LENGTHS[-1]))
        ttft = case.ttft_ms * (1 + case.ttft_growth * along)
        out.append(tuple(RunTimes(tuple(ttft * f + tpot * f * i for i in range(n)))
                         for f in factors(rng, case, repeats) * round_factor))
    return out


def worst_step_rule(runs, seed: int) -> str:
    """The earlier rule: the minimum step of tokens/s, its 95% percentile interval above -5%."""
    values = [hypotheses.run_values(r) for r in runs]

    def worst(per_length):
        rates = per_length[..., hypotheses.RATE]
        return (rates[..., 1:] / rates[..., :-1] - 1).min(axis=-1)

    interval = hypotheses.bootstrap(values, worst, seed)
    return hypotheses.decide(interval, -hypotheses.FALL_TOLERANCE, np.inf)


def rules_mode(sweeps: int) -> None:
    cases = [Case("bimodal"), Case("bimodal", fall=0.3), Case("normal", 0.02), Case("normal", 0.02, fall=0.2),
             Case("normal", 0.05), Case("normal", 0.05, fall=0.2)]
    for case in cases:
        counts = [Counter() for _ in range(3)]
        earlier = Counter()
        for seed in range(sweeps):
            runs = sweep(seed, case)
            for count, verdict in zip(counts, hypotheses.check_all(LENGTHS, runs, seed=seed)):
                count[verdict.verdict] += 1
            earlier[worst_step_rule(runs, seed)] += 1
        label = f"{case.noise}{'' if case.noise == 'bimodal' else f' {100 * case.spread:.0f}%'}, fall {100 * case.fall:.0f}%"
        print(f"{label:22} linear {dict(counts[0])} | ttft {dict(counts[1])} | plateau {dict(counts[2])} "
              f"| plateau, worst step alone {dict(earlier)}", flush=True)


def cpu_case(noise: str, **truth) -> Case:
    """The CPU sweep's engine (TTFT 135 ms, TPOT 32.5 ms), its runs N(1, 3%) under `noise`."""
    return Case(noise, 0.03, ttft_ms=135.0, tpot_ms=32.5, **truth)


TOP_UP_CASES = (cpu_case("normal"), cpu_case("stalls"), cpu_case("stalls", fall=0.2), cpu_case("stalls", growth=0.2),
                cpu_case("stalls", growth=0.15))


def bonferroni(runs: int, max_runs: int) -> float:
    """Each look's confidence when the 5% is shared among the looks at runs, runs + 1, ..., max_runs."""
    return 1 - (1 - hypotheses.CONFIDENCE) / (max_runs - runs + 1)


def judged_three_ways(job: tuple[int, Case, int, int]) -> dict[str, tuple]:
    """One simulated sweep's verdicts: on `runs` runs, on `max_runs` runs, and topped up from one to the other."""
    seed, case, runs, max_runs = job
    drawn = sweep(seed, case, max_runs)
    looks = {}

    def judge(n: int, confidence: float) -> tuple[hypotheses.Verdict, ...]:
        if (n, confidence) not in looks:  # the fixed rules and the top-up share their looks
            looks[n, confidence] = hypotheses.check_all(LENGTHS, [r[:n] for r in drawn], seed=seed, confidence=confidence)
        return looks[n, confidence]

    outcomes = {f"fixed {n}": (judge(n, hypotheses.CONFIDENCE), n) for n in (runs, max_runs)}
    for confidence in (hypotheses.CONFIDENCE, bonferroni(runs, max_runs)):
        rule = f"top-up {runs}->{max_runs}, {100 * confidence:.4g}% per look"
        outcomes[rule] = top_up.judge_topped_up(judge, runs, max_runs, confidence)
    return {rule: (tuple(v.verdict for v in verdicts), used) for rule, (verdicts, used) in outcomes.items()}


PAIRED_CASES = (cpu_case("normal"), cpu_case("stalls"), cpu_case("stalls", growth=0.15),
                *(cpu_case(noise, phases=0.3, **truth) for noise, truth in (
                    ("normal", {}), ("stalls", {}), ("stalls", {"fall": 0.2}), ("stalls", {"growth": 0.15}),
                    ("stalls", {"ttft_growth": 0.15}))))


def judged_paired(job: tuple[int, Case, int, int, int]) -> dict[str, tuple]:
    """One simulated sweep's verdicts on `runs` runs, on `max_runs` runs and topped up at 95% per
    look, each with the runs independent and paired by round (from `min_rounds` rounds)."""
    seed, case, runs, max_runs, min_rounds = job
    drawn = sweep(seed, case, max_runs)
    outcomes = {}
    for pairing in ("runs", "rounds"):
        def judge(n: int, confidence: float) -> tuple[hypotheses.Verdict, ...]:
            rounds = [tuple(range(n))] * len(LENGTHS) if pairing == "rounds" else None
            return hypotheses.check_all(LENGTHS, [r[:n] for r in drawn], seed=seed, confidence=confidence, rounds=rounds,
                                        min_rounds=min_rounds)

        for n in (runs, max_runs):
            outcomes[f"{pairing}: fixed {n}"] = (judge(n, hypotheses.CONFIDENCE), n)
        outcomes[f"{pairing}: top-up {runs}->{max_runs}"] = top_up.judge_topped_up(judge, runs, max_runs,
                                                                                  hypotheses.CONFIDENCE)
    return {rule: (tuple(v.verdict for v in verdicts), used) for rule, (verdicts, used) in outcomes.items()}


def errors(verdicts: tuple[str, ...], holds: tuple[bool, ...]) -> tuple[bool, bool]:
    """(some true hypothesis got DOES NOT HOLD, some false one got HOLDS)."""
    return (any(h and v == hypotheses.DOES_NOT_HOLD for v, h in zip(verdicts, holds)),
            any(not h and v == hypotheses.HOLDS for v, h in zip(verdicts, holds)))


def top_up_mode(sweeps: int, runs: int, max_runs: int, workers: int, paired: bool = False,
                min_rounds: int = hypotheses.PAIRED_MIN_ROUNDS) -> None:
    if paired:
        print(f"every rule judged at {100 * hypotheses.CONFIDENCE:.0f}% (per look), with the runs independent and "
              f"paired by round; {sweeps} sweeps per truth")
    else:
        print(f"fixed runs judged at {100 * hypotheses.CONFIDENCE:.0f}%; top-up at {100 * hypotheses.CONFIDENCE:.0f}% "
              f"per look, and at {100 * bonferroni(runs, max_runs):.4g}% per look (Bonferroni over "
              f"{max_runs - runs + 1} looks); {sweeps} sweeps per truth")
    judged, cases = (judged_paired, PAIRED_CASES) if paired else (judged_three_ways, TOP_UP_CASES)
    first_rule = f"runs: fixed {runs}" if paired else f"fixed {runs}"
    print("| truth | rule | total latency linear (H / N / I) | TTFT independent (H / N / I) | "
          "tokens/s plateaus (H / N / I) | sweeps with a false DOES NOT HOLD (new after the first look) | "
          "sweeps with a missed violation | mean runs per length |")
    print("|---|---|---|---|---|---|---|---|")
    with ProcessPoolExecutor(workers) as pool:
        for case in cases:
            jobs = [(seed, case, runs, max_runs, *((min_rounds,) if paired else ())) for seed in range(sweeps)]
            outcomes = list(pool.map(judged, jobs, chunksize=16))
            for rule in outcomes[0]:
                counts = [Counter(o[rule][0][i] for o in outcomes) for i in range(3)]
                cells = [" / ".join(str(c[v]) for v in (hypotheses.HOLDS, hypotheses.DOES_NOT_HOLD, hypotheses.INCONCLUSIVE))
                         for c in counts]
                wrong = [errors(o[rule][0], case.holds) for o in outcomes]
                first = [errors(o[first_rule][0], case.holds)[0] for o in outcomes]
                false_alarms = sum(alarm for alarm, _ in wrong)
                new = sum(alarm and not before for (alarm, _), before in zip(wrong, first))
                misses = sum(miss for _, miss in wrong)
                mean_runs = np.mean([o[rule][1] for o in outcomes])
                print(f"| {case.label} | {rule} | {' | '.join(cells)} | {false_alarms} ({new}) | {misses} | "
                      f"{mean_runs:.1f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=200)
    parser.add_argument("--top-up", action="store_true", help="fixed runs against topping up while undecided")
    parser.add_argument("--runs", type=int, default=3, help="--top-up: the base runs per length (default 3)")
    parser.add_argument("--max-runs", type=int, default=10, help="--top-up: at most this many (default 10)")
    parser.add_argument("--workers", type=int, default=2, help="--top-up: processes (default 2)")
    parser.add_argument("--paired", action="store_true",
                        help="the top-up's rules with the runs independent and paired by round, on host phases too")
    parser.add_argument("--paired-min-rounds", type=int, default=hypotheses.PAIRED_MIN_ROUNDS,
                        help="--paired: rounds before the runs are paired (default: the hypotheses')")
    args = parser.parse_args()
    if args.top_up or args.paired:
        top_up_mode(args.sweeps, args.runs, args.max_runs, args.workers, args.paired, args.paired_min_rounds)
    else:
        rules_mode(args.sweeps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
