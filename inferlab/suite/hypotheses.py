"""The seed's three hypotheses about output length, judged on measured runs with a noise model.

Each check takes one group (one engine, prompt length and batch size): the output lengths
N_1 < ... < N_k and the raw runs measured at each. Per length it takes medians over runs
(TTFT_i, TPOT_i, R_i = output tokens/s), so one slow run moves little.

Noise model: a bootstrap over runs. The runs of each length are resampled with replacement
(independently per length, `RESAMPLES` times, from a generator seeded by the caller), the
statistic is recomputed from the resampled medians, and its 95% interval is the 2.5th-97.5th
percentile of those values (each check takes another `confidence` if asked). Run-to-run noise,
and with the sweep's interleaved order the host's drift over the sweep too, widen the interval;
nothing else is assumed about their shape.

Paired by round, where the caller gives each run's round (`rounds`), run j of every length ran in
the same round, and there are at least `PAIRED_MIN_ROUNDS` rounds (`min_rounds`): the interleaved sweep measures
every length once a round, so a host that is slow for a while is slow for every length of that
round, and the runs of one length are not independent of the others'. Then each round's slowness
(per value, the median over lengths of its runs against their lengths' medians, in logs) is
divided out of its runs before the per-length medians (`round_adjusted_medians`), and the
bootstrap resamples whole rounds. A slow round then moves no length against another, and one
stalled run moves neither its round's slowness nor its length's median. On the 2-core CPU host,
whose runs come in slow and fast phases a round or more long, this decides what the bootstrap
over runs leaves open (docs/perf/cpu/paired-rounds.md).

Three answers, from the interval [lo, hi] of the statistic and the hypothesis's tolerance:

- HOLDS: the interval lies inside the tolerance.
- DOES NOT HOLD: the interval lies entirely outside it; the explanation gives the effect.
- INCONCLUSIVE: the interval straddles a bound of the tolerance. An interval narrows as
  1/sqrt(runs), so about n * (h / d)^2 runs per length would decide it, with n the runs per
  length now, d the distance from the estimate to the bound and h the interval's half-width
  on that side; the explanation says so. With fewer than `MIN_RUNS` runs at some length the
  noise cannot be estimated: INCONCLUSIVE whatever the numbers.

With fewer than 3 output lengths every check answers "not enough data": a line through two
points always fits.

1. Total latency grows linearly with output length. Per run, exactly E2E = TTFT + (N - 1) * TPOT,
   so E2E is a line in N exactly when TTFT (hypothesis 2) and TPOT do not depend on N; this
   check judges TPOT. Physics predicts one dependence: decode step i reads the weights plus
   the KV cache of P + i positions, so a request's TPOT covers a mean context of P + N/2 and,
   if a step takes time in proportion to the bytes it reads, TPOT(N) is proportional to
   bytes_per_step(N) = weights + KV bytes per position * B * (P + N/2) (`measure.roofline`).
   Statistic: the measured growth of TPOT across the sweep, from the least-squares line
   TPOT_i = c + s * N_i: g = s * (N_k - N_1) / (c + s * N_1), minus the predicted growth
   g_pred = bytes_per_step(N_k) / bytes_per_step(N_1) - 1. Holds when the interval of
   g - g_pred lies within +-10% (`TPOT_TOLERANCE`). Lengths with N = 1 have no TPOT and are
   left out. Without byte counts the predicted growth is taken as 0.
2. TTFT does not depend on N. The prefill is the same work whatever follows it. Statistic: the
   fitted change across the sweep, s * (N_k - N_1) from the least-squares line
   TTFT_i = c + s * N_i (a trend, so one noisy length moves it little). Holds when its interval
   lies within +-max(10% of TTFT_ref, 1 ms), TTFT_ref the median of the TTFT_i; the 1 ms floor
   (`SLACK_MS`) because a request's fixed host-side overhead (Python dispatch, starting the
   clock, the final synchronize) varies by tenths of a millisecond, and on a GPU, where TTFT
   can be a few ms, a purely relative tolerance would judge that jitter rather than the model.
3. Output tokens/s rises, then plateaus. R(N) = N / (TTFT + (N - 1) * TPOT) rises towards
   1000 / TPOT as the prefill is amortized; it can only fall if a step gets slower with N.
   How much it visibly rises, and how close to the plateau it is at N_k
   (R_k * TPOT_k / 1000 = N_k / (N_k - 1 + TTFT / TPOT)), is set by TTFT / TPOT, not by the
   hypothesis: an eager loop on a GPU has TTFT ~ TPOT and is flat from N = 10, a graph-replayed
   engine with TTFT / TPOT ~ 40 is at ~93% of its plateau at N = 500. Both are reported; what
   can refute the hypothesis is a fall. Statistic: each step R_{i+1} / R_i - 1 with its own
   interval. Holds when every step's 95% interval lies above -5% (`FALL_TOLERANCE`); does not
   hold when some step's interval at confidence 1 - 0.05 / (k - 1) (Bonferroni over the steps)
   lies below -5%; otherwise inconclusive, judged on the step whose interval reaches lowest.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from inferlab.measure.metrics import RunTimes

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
INCONCLUSIVE = "inconclusive"
NOT_ENOUGH_DATA = "not enough data"

MIN_LENGTHS = 3
MIN_RUNS = 3  # per length: fewer cannot estimate the noise
RESAMPLES = 2000
CONFIDENCE = 0.95
SLACK_MS = 1.0
TPOT_TOLERANCE = 0.10  # growth of TPOT across the sweep beyond the KV cache's prediction
TTFT_TOLERANCE = 0.10  # of TTFT_ref, for the change across the sweep
FALL_TOLERANCE = 0.05  # of tokens/s, for each step between consecutive lengths
MAX_RUNS_ADVICE = 1000
# Rounds before the runs are paired by round: from 3, simulated sweeps with stalled runs gave more
# false DOES NOT HOLDs than over runs; from 5, none more (docs/perf/cpu/paired-rounds.md)
PAIRED_MIN_ROUNDS = 5

LINEAR_LATENCY = "total latency grows linearly with output length"
TTFT_INDEPENDENT = "TTFT does not depend on output length"
TOKENS_PLATEAU = "output tokens/s rises and then plateaus"

# Per-run values a statistic can use, in this order along the last axis.
RUN_VALUES = ("ttft_ms", "tpot_ms", "output_tokens_per_s")
TTFT, TPOT, RATE = range(3)


@dataclass(frozen=True)
class Verdict:
    """One hypothesis checked on one group: the verdict, the numbers behind it, one line of why."""

    name: str
    verdict: str  # HOLDS, DOES_NOT_HOLD, INCONCLUSIVE or NOT_ENOUGH_DATA
    numbers: dict
    explanation: str

    def to_dict(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "numbers": dict(self.numbers), "explanation": self.explanation}


@dataclass(frozen=True)
class Interval:
    """A statistic's estimate (from all runs) and its bootstrap interval [low, high]."""

    estimate: float
    low: float
    high: float


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares y = c + s * x along the last axis (x [k], y [..., k]) -> (s, c), each [...]."""
    dx = x - x.mean()
    slope = (dx * (y - y.mean(axis=-1, keepdims=True))).sum(axis=-1) / (dx * dx).sum()
    return slope, y.mean(axis=-1) - slope * x.mean()


def run_values(runs: Sequence[RunTimes]) -> np.ndarray:
    """[n, 3]: TTFT, TPOT (NaN for a one-token run) and output tokens/s of each run."""
    rows = [(r.ttft_ms, np.nan if r.tpot_ms is None else r.tpot_ms, r.output_tokens_per_s) for r in runs]
    return np.asarray(rows, dtype=float).reshape(len(rows), len(RUN_VALUES))


def medians(values: Sequence[np.ndarray]) -> np.ndarray:
    """[k, 3]: per length, the median over its runs."""
    return np.stack([np.median(v, axis=0) for v in values])


def bootstrap_draws(values: Sequence[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], seed: int,
                    resamples: int = RESAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """`statistic` of per-length medians ([..., k, 3] -> [...]) on all runs, and on `resamples`
    bootstrap resamples ([resamples, ...]): the runs of each length resampled with replacement,
    independently per length."""
    rng = np.random.default_rng(seed)
    resampled = []
    for v in values:
        picks = rng.integers(0, len(v), size=(resamples, len(v)))
        resampled.append(np.median(v[picks], axis=1))  # [resamples, 3]
    return np.asarray(statistic(medians(values)), dtype=float), np.asarray(statistic(np.stack(resampled, axis=1)))


def rounds_paired(rounds: Sequence[Sequence[int]] | None, counts: Sequence[int],
                  min_rounds: int = PAIRED_MIN_ROUNDS) -> bool:
    """Whether to pair by round: run j of every length ran in the same round (`rounds`: each length's
    runs' rounds, in the runs' order; `counts`: each length's runs), and there are at least
    `min_rounds` rounds."""
    if rounds is None or len(rounds) != len(counts) or not counts:
        return False
    first = tuple(rounds[0])
    return len(first) >= min_rounds and all(tuple(r) == first and len(r) == count for r, count in zip(rounds, counts))


def round_adjusted_medians(rounds: np.ndarray) -> np.ndarray:
    """[..., n, k, 3] (n rounds of k lengths) -> [..., k, 3]: per length, the median over rounds of its
    runs with each round's slowness divided out. A round's slowness, per value, is the median over
    lengths of how much its run is above that length's median run (in logs: one sweep of Tukey's
    median polish), so one stalled run moves neither its round's slowness nor its length's median."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a value no length has (TPOT where every N = 1)
        logs = np.log(np.where(rounds > 0, rounds, np.nan))  # a zero says nothing of its round's slowness
        above = logs - np.nanmedian(logs, axis=-3, keepdims=True)  # each run against its length's median
        slowness = np.nan_to_num(np.nanmedian(above, axis=-2, keepdims=True))
    return np.median(rounds / np.exp(slowness), axis=-3)


def round_draws(values: Sequence[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], seed: int,
                resamples: int = RESAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """`statistic` ([..., k, 3] -> [...]) of the round-adjusted medians (`round_adjusted_medians`; run j of
    every length in round j, values [k] x [n, 3]), on all rounds and on `resamples` resamples of the rounds."""
    rounds = np.stack(values, axis=1)  # [n, k, 3]
    picks = np.random.default_rng(seed).integers(0, len(rounds), size=(resamples, len(rounds)))
    return (np.asarray(statistic(round_adjusted_medians(rounds)), dtype=float),
            np.asarray(statistic(round_adjusted_medians(rounds[picks]))))


def statistic_draws(values: Sequence[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], seed: int,
                    paired: bool, resamples: int = RESAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """The estimate and bootstrap draws of `statistic`: by round where `paired`, else over runs."""
    return (round_draws if paired else bootstrap_draws)(values, statistic, seed, resamples)


def percentile_interval(estimate: float, draws: np.ndarray, confidence: float = CONFIDENCE) -> Interval:
    """The `confidence` percentile interval of bootstrap `draws` [resamples] around `estimate`."""
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Interval(float(estimate), float(low), float(high))


def bootstrap(values: Sequence[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray], seed: int,
              resamples: int = RESAMPLES, confidence: float = CONFIDENCE, paired: bool = False) -> Interval:
    """`statistic` of per-length medians ([..., k, 3] -> [...]) with its percentile bootstrap interval;
    `paired`: of the round-adjusted medians, whole rounds resampled (`round_draws`)."""
    estimate, drawn = statistic_draws(values, statistic, seed, paired, resamples)
    return percentile_interval(float(estimate), drawn, confidence)


def decide(interval: Interval, low_bound: float, high_bound: float) -> str:
    """HOLDS inside [low_bound, high_bound], DOES_NOT_HOLD entirely outside, INCONCLUSIVE across a bound."""
    if low_bound <= interval.low and interval.high <= high_bound:
        return HOLDS
    if interval.high < low_bound or interval.low > high_bound:
        return DOES_NOT_HOLD
    return INCONCLUSIVE


def runs_to_decide(interval: Interval, low_bound: float, high_bound: float, runs_now: int) -> int | None:
    """About how many runs per length would put the interval clear of the bound it straddles:
    n * (h / d)^2, h its half-width towards the bound, d the estimate's distance to it; None if
    the estimate sits on the bound (no number of runs would decide it)."""
    straddled = low_bound if interval.low < low_bound <= interval.high else high_bound
    distance = abs(interval.estimate - straddled)
    half_width = interval.estimate - interval.low if straddled < interval.estimate else interval.high - interval.estimate
    if distance <= 1e-12 * max(1.0, abs(straddled)):
        return None
    return max(runs_now + 1, math.ceil(runs_now * (half_width / distance) ** 2 - 1e-9))  # 20.000000004 is 20


def _sorted(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]],
            rounds: Sequence[Sequence[int]] | None = None) -> tuple[list[int], list, list | None]:
    assert len(output_lengths) == len(runs), "one list of runs per output length"
    assert len(set(output_lengths)) == len(output_lengths), "each output length once"
    assert rounds is None or len(rounds) == len(runs), "one list of rounds per output length"
    order = sorted(range(len(output_lengths)), key=lambda i: output_lengths[i])
    return ([output_lengths[i] for i in order], [runs[i] for i in order],
            None if rounds is None else [rounds[i] for i in order])


def _paired_text(paired: bool) -> str:
    return "; runs paired by round" if paired else ""


def _not_enough(name: str, count: int) -> Verdict | None:
    if count >= MIN_LENGTHS:
        return None
    return Verdict(name, NOT_ENOUGH_DATA, {"output_lengths": count},
                   f"needs at least {MIN_LENGTHS} output lengths with results, got {count}")


def _interval_text(interval: Interval, scale: float, unit: str, digits: int, confidence: float = CONFIDENCE) -> str:
    f = f"{{:+.{digits}f}}"
    return (f"{f.format(scale * interval.estimate)}{unit} "
            f"({100 * confidence:.3g}% CI {f.format(scale * interval.low)}..{f.format(scale * interval.high)}{unit})")


def _judge(name: str, interval: Interval, bounds: tuple[float, float], runs_per_length: Sequence[int],
           numbers: dict, text: str, confidence: float = CONFIDENCE) -> Verdict:
    """The verdict of `interval` against `bounds`, with the advice for an inconclusive one."""
    fewest = min(runs_per_length)
    numbers = {"confidence": confidence, **numbers, "estimate": interval.estimate, "ci_low": interval.low,
               "ci_high": interval.high, "tolerance_low": bounds[0], "tolerance_high": bounds[1],
               "runs_per_length": fewest}
    if fewest < MIN_RUNS:
        return Verdict(name, INCONCLUSIVE, {**numbers, "runs_to_decide": MIN_RUNS},
                       f"{text}; too few runs to estimate the noise: {fewest} at some length, "
                       f"needs at least {MIN_RUNS} per length")
    verdict = decide(interval, *bounds)
    if verdict != INCONCLUSIVE:
        return Verdict(name, verdict, numbers, text)
    needed = runs_to_decide(interval, *bounds, fewest)
    numbers["runs_to_decide"] = needed
    advice = (f"about {needed} runs per length would decide it" if needed is not None and needed <= MAX_RUNS_ADVICE
              else f"the effect sits on the tolerance: more than {MAX_RUNS_ADVICE} runs per length to decide it")
    return Verdict(name, INCONCLUSIVE, numbers, f"{text}; the interval straddles the tolerance, {advice}")


def check_linear_latency(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]],
                         bytes_per_step: Sequence[float] | None = None, seed: int = 0,
                         confidence: float = CONFIDENCE, rounds: Sequence[Sequence[int]] | None = None,
                         min_rounds: int = PAIRED_MIN_ROUNDS) -> Verdict:
    """Hypothesis 1: TPOT's growth across the sweep, beyond the KV cache's prediction, within +-10%."""
    if bytes_per_step is not None:
        assert len(bytes_per_step) == len(output_lengths), "one byte count per output length"
        order = sorted(range(len(output_lengths)), key=lambda i: output_lengths[i])
        bytes_per_step = [bytes_per_step[i] for i in order]
    lengths, runs, rounds = _sorted(output_lengths, runs, rounds)
    short = _not_enough(LINEAR_LATENCY, len(lengths))
    if short:
        return short
    keep = [i for i, n in enumerate(lengths) if n >= 2]  # N = 1 has no TPOT
    short = _not_enough(LINEAR_LATENCY, len(keep))
    if short:
        return short
    x = np.asarray([lengths[i] for i in keep], dtype=float)
    values = [run_values(runs[i]) for i in keep]
    span = x[-1] - x[0]

    def growth(per_length: np.ndarray) -> np.ndarray:
        slope, intercept = fit_line(x, per_length[..., TPOT])
        return slope * span / (intercept + slope * x[0])

    predicted = 0.0 if bytes_per_step is None else bytes_per_step[keep[-1]] / bytes_per_step[keep[0]] - 1
    paired = rounds_paired(None if rounds is None else [rounds[i] for i in keep], [len(v) for v in values], min_rounds)
    interval = bootstrap(values, lambda m: growth(m) - predicted, seed, confidence=confidence, paired=paired)
    measured = interval.estimate + predicted
    tpots = medians(values)[:, TPOT]
    numbers = {"measured_growth": measured, "predicted_growth": predicted, "tpot_first_ms": float(tpots[0]),
               "tpot_last_ms": float(tpots[-1]), "prediction": "none" if bytes_per_step is None else "kv cache bytes",
               "paired_by_round": paired}
    text = (f"TPOT p50 {tpots[0]:.3f} -> {tpots[-1]:.3f} ms from N={int(x[0])} to N={int(x[-1])}: fitted growth "
            f"{100 * measured:+.1f}%, the KV cache predicts {100 * predicted:+.1f}%; excess "
            f"{_interval_text(interval, 100, '%', 1, confidence)}, tolerance +-{100 * TPOT_TOLERANCE:.0f}%"
            f"{_paired_text(paired)}")
    return _judge(LINEAR_LATENCY, interval, (-TPOT_TOLERANCE, TPOT_TOLERANCE), [len(v) for v in values], numbers, text,
                  confidence)


def check_ttft_independent(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]], seed: int = 0,
                           confidence: float = CONFIDENCE, rounds: Sequence[Sequence[int]] | None = None,
                           min_rounds: int = PAIRED_MIN_ROUNDS) -> Verdict:
    """Hypothesis 2: TTFT's fitted change across the sweep within +-max(10% TTFT_ref, 1 ms)."""
    lengths, runs, rounds = _sorted(output_lengths, runs, rounds)
    short = _not_enough(TTFT_INDEPENDENT, len(lengths))
    if short:
        return short
    x = np.asarray(lengths, dtype=float)
    values = [run_values(r) for r in runs]
    ttfts = medians(values)[:, TTFT]
    ttft_ref = float(np.median(ttfts))
    tolerance = max(TTFT_TOLERANCE * ttft_ref, SLACK_MS)

    def change(per_length: np.ndarray) -> np.ndarray:
        return fit_line(x, per_length[..., TTFT])[0] * (x[-1] - x[0])

    paired = rounds_paired(rounds, [len(v) for v in values], min_rounds)
    interval = bootstrap(values, change, seed, confidence=confidence, paired=paired)
    numbers = {"change_ms": interval.estimate, "tolerance_ms": tolerance, "ttft_ref_ms": ttft_ref,
               "relative_change": interval.estimate / ttft_ref if ttft_ref > 0 else 0.0, "paired_by_round": paired}
    text = (f"TTFT p50 {ttfts.min():.2f}-{ttfts.max():.2f} ms; fitted change from N={lengths[0]} to N={lengths[-1]} "
            f"{_interval_text(interval, 1, ' ms', 2, confidence)}, {100 * numbers['relative_change']:+.1f}% of TTFT; "
            f"tolerance +-{tolerance:.2f} ms{_paired_text(paired)}")
    return _judge(TTFT_INDEPENDENT, interval, (-tolerance, tolerance), [len(v) for v in values], numbers, text,
                  confidence)


def check_tokens_plateau(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]], seed: int = 0,
                         confidence: float = CONFIDENCE, rounds: Sequence[Sequence[int]] | None = None,
                         min_rounds: int = PAIRED_MIN_ROUNDS) -> Verdict:
    """Hypothesis 3: no step of output tokens/s, R_{i+1} / R_i - 1, falls beyond -5%.

    Each step has its own interval; HOLDS needs every step's 95% interval above -5%, DOES NOT
    HOLD needs one step's interval at the family's confidence (Bonferroni over the k - 1 steps)
    below it. Judging only the worst step against a 95% interval would not do: the minimum of
    k - 1 noisy steps is biased below the true worst step, and on a bimodal host (runs either
    fast or about 45% slower, as eager engines on a GPU host) it calls an unchanged engine
    falling in about 15% of sweeps of 5 runs per length.
    """
    lengths, runs, rounds = _sorted(output_lengths, runs, rounds)
    short = _not_enough(TOKENS_PLATEAU, len(lengths))
    if short:
        return short
    values = [run_values(r) for r in runs]

    def steps(per_length: np.ndarray) -> np.ndarray:
        rates = per_length[..., RATE]
        return rates[..., 1:] / rates[..., :-1] - 1

    paired = rounds_paired(rounds, [len(v) for v in values], min_rounds)
    estimates, draws = statistic_draws(values, steps, seed, paired)
    family = 1 - (1 - confidence) / len(estimates)
    single = [percentile_interval(e, draws[:, i], confidence) for i, e in enumerate(estimates)]
    joint = [percentile_interval(e, draws[:, i], family) for i, e in enumerate(estimates)]
    fell = [i for i, interval in enumerate(joint) if interval.high < -FALL_TOLERANCE]
    if fell:
        shown = min(fell, key=lambda i: estimates[i])
        interval, shown_confidence = joint[shown], family
    elif all(interval.low >= -FALL_TOLERANCE for interval in single):
        shown = int(np.argmin(estimates))
        interval, shown_confidence = single[shown], confidence
    else:  # some step's family interval straddles the tolerance: the most doubtful one decides nothing yet
        shown = min(range(len(joint)), key=lambda i: joint[i].low)
        interval, shown_confidence = joint[shown], family
    per_length = medians(values)
    rates, tpot_last = per_length[:, RATE], per_length[-1, TPOT]
    plateau = None if np.isnan(tpot_last) else float(rates[-1] * tpot_last / 1e3)  # R_k against 1000 / TPOT_k
    numbers = {"tokens_per_s_first": float(rates[0]), "tokens_per_s_last": float(rates[-1]),
               "total_gain": float(rates[-1] / rates[0] - 1), "worst_step_change": float(estimates.min()),
               "step_changes": [float(e) for e in estimates], "shown_step": [lengths[shown], lengths[shown + 1]],
               "confidence": shown_confidence, "fraction_of_decode_rate": plateau, "paired_by_round": paired}
    reached = "" if plateau is None else f", {100 * plateau:.0f}% of its plateau 1/TPOT"
    text = (f"tok/s p50 {rates[0]:.1f} at N={lengths[0]} -> {rates[-1]:.1f} at N={lengths[-1]} "
            f"({100 * numbers['total_gain']:+.0f}%{reached}); step N={lengths[shown]}->{lengths[shown + 1]} "
            f"{_interval_text(interval, 100, '%', 1, shown_confidence)}, a fall counts beyond -{100 * FALL_TOLERANCE:.0f}%"
            f"{_paired_text(paired)}")
    return _judge(TOKENS_PLATEAU, interval, (-FALL_TOLERANCE, math.inf), [len(v) for v in values], numbers, text,
                  shown_confidence)


def check_all(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]],
              bytes_per_step: Sequence[float] | None = None, seed: int = 0,
              confidence: float = CONFIDENCE, rounds: Sequence[Sequence[int]] | None = None,
              min_rounds: int = PAIRED_MIN_ROUNDS) -> tuple[Verdict, ...]:
    """The three hypotheses, in the seed's order; `bytes_per_step` per length (roofline) predicts TPOT's growth;
    every interval at `confidence` (the tokens/s steps at its Bonferroni share); `rounds`, each length's runs'
    rounds in an interleaved sweep: where run j of every length ran in one round, from `min_rounds` rounds on,
    paired by round."""
    return (
        check_linear_latency(output_lengths, runs, bytes_per_step, seed, confidence, rounds, min_rounds),
        check_ttft_independent(output_lengths, runs, seed, confidence, rounds, min_rounds),
        check_tokens_plateau(output_lengths, runs, seed, confidence, rounds, min_rounds),
    )
