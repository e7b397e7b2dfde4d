"""The seed's three hypotheses about output length, checked on measured runs.

Each check takes one group (one engine, prompt length and batch size): the output lengths
N_1 < ... < N_k and the raw runs measured at each. It works on per-length medians over runs
(TTFT_i, E2E_i, TPOT_i, R_i = output tokens/s), so one slow run moves nothing. With fewer than
3 lengths every check answers "not enough data": a line through two points always fits.

References, medians across lengths: TTFT_ref = median_i TTFT_i, TPOT_ref = median_i TPOT_i
(TPOT needs N >= 2). Tolerances below are relative to them, with an absolute floor of
`SLACK_MS` = 1 ms: a request's fixed host-side overhead (Python dispatch, starting the clock,
the final synchronize) varies by tenths of a millisecond, so on a GPU, where TTFT can be a few
ms, a purely relative tolerance would judge that jitter rather than the model.

1. Total latency is linear in N. Per run, exactly E2E = TTFT + (N - 1) * TPOT (metrics.py's
   definition of TPOT). If TTFT and TPOT do not depend on N, E2E(N) = (TTFT - TPOT) + TPOT * N:
   slope TPOT, intercept TTFT - TPOT, not TTFT (the prefill produces the first token, so only
   N - 1 decode steps follow). Least squares E2E_i = a + b * N_i, R^2 = 1 - SS_res / SS_tot.
   Holds when R^2 >= 0.99 and |b - TPOT_ref| <= 10% TPOT_ref and
   |a - (TTFT_ref - TPOT_ref)| <= max(25% TTFT_ref, 1 ms).
   The intercept is extrapolated to N = 0 from lengths up to hundreds of tokens: a TPOT that
   creeps up with the context (the KV cache grows) bends the line and moves `a` by several TPOTs
   while R^2 stays near 1. The explanation then names TPOT's drift from N_1 to N_k.
2. TTFT does not depend on N. The prefill is the same work whatever follows it. Least squares
   TTFT_i = c + s * N_i; the fitted change across the sweep is s * (N_k - N_1). Holds when
   |s * (N_k - N_1)| <= max(10% TTFT_ref, 1 ms): a trend, so one noisy length moves it little,
   and 10% is well above the few-% noise of a median of runs.
3. Output tokens/s rises, then plateaus. R(N) = N / (TTFT + (N - 1) * TPOT) tends to
   1000 / TPOT (decode tokens/s) as the prefill is amortized over more tokens. Holds when
   it rises: R_k >= 1.05 * R_1; it never falls by more than noise: R_{i+1} >= 0.95 * R_i; and it
   has levelled off: the last step's gain R_k / R_{k-1} - 1 < 5%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from inferlab.measure.metrics import RunTimes

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
NOT_ENOUGH_DATA = "not enough data"

MIN_LENGTHS = 3
SLACK_MS = 1.0
MIN_R_SQUARED = 0.99
SLOPE_TOLERANCE = 0.10  # of TPOT_ref
INTERCEPT_TOLERANCE = 0.25  # of TTFT_ref
TTFT_TOLERANCE = 0.10  # of TTFT_ref, for the change across the sweep
TOKENS_STEP = 0.05  # rise, fall-within-noise and plateau thresholds for tokens/s

LINEAR_LATENCY = "total latency grows linearly with output length"
TTFT_INDEPENDENT = "TTFT does not depend on output length"
TOKENS_PLATEAU = "output tokens/s rises and then plateaus"


@dataclass(frozen=True)
class Verdict:
    """One hypothesis checked on one group: the verdict, the numbers behind it, one line of why."""

    name: str
    verdict: str  # HOLDS, DOES_NOT_HOLD or NOT_ENOUGH_DATA
    numbers: dict
    explanation: str

    def to_dict(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "numbers": dict(self.numbers), "explanation": self.explanation}


@dataclass(frozen=True)
class LinearFit:
    """y = intercept + slope * x by least squares; r_squared = 1 - SS_res / SS_tot."""

    slope: float
    intercept: float
    r_squared: float


def linear_fit(x: Sequence[float], y: Sequence[float]) -> LinearFit:
    """Ordinary least squares of y on x (at least two distinct x)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    assert len(xs) == len(ys) >= 2 and np.ptp(xs) > 0, "a fit needs two distinct x"
    dx = xs - xs.mean()
    slope = float((dx * (ys - ys.mean())).sum() / (dx * dx).sum())
    intercept = float(ys.mean() - slope * xs.mean())
    ss_res = float(((ys - intercept - slope * xs) ** 2).sum())
    ss_tot = float(((ys - ys.mean()) ** 2).sum())
    r_squared = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return LinearFit(slope, intercept, r_squared)


def medians(runs: Sequence[Sequence[RunTimes]], metric: str) -> list[float | None]:
    """Per length, the median over runs of `metric` (a RunTimes property); None where undefined."""
    out = []
    for length_runs in runs:
        values = [getattr(r, metric) for r in length_runs]
        values = [v for v in values if v is not None]
        out.append(float(np.median(values)) if values else None)
    return out


def _sorted(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]]) -> tuple[list[int], list]:
    assert len(output_lengths) == len(runs), "one list of runs per output length"
    assert len(set(output_lengths)) == len(output_lengths), "each output length once"
    pairs = sorted(zip(output_lengths, runs), key=lambda pair: pair[0])
    return [n for n, _ in pairs], [r for _, r in pairs]


def _not_enough(name: str, count: int) -> Verdict | None:
    if count >= MIN_LENGTHS:
        return None
    return Verdict(name, NOT_ENOUGH_DATA, {"output_lengths": count},
                   f"needs at least {MIN_LENGTHS} output lengths with results, got {count}")


def _references(runs: Sequence[Sequence[RunTimes]]) -> tuple[float, float | None]:
    ttft = float(np.median(medians(runs, "ttft_ms")))
    tpots = [t for t in medians(runs, "tpot_ms") if t is not None]
    return ttft, (float(np.median(tpots)) if tpots else None)


def check_linear_latency(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]]) -> Verdict:
    """Hypothesis 1: E2E_i = a + b * N_i with R^2 >= 0.99, b ~ TPOT_ref, a ~ TTFT_ref - TPOT_ref."""
    lengths, runs = _sorted(output_lengths, runs)
    short = _not_enough(LINEAR_LATENCY, len(lengths))
    if short:
        return short
    ttft_ref, tpot_ref = _references(runs)  # defined: of 3 distinct lengths at most one is N = 1
    assert tpot_ref is not None and tpot_ref > 0, "TPOT of a measured run is positive"
    fit = linear_fit(lengths, medians(runs, "e2e_ms"))
    expected_intercept = ttft_ref - tpot_ref
    intercept_slack = max(INTERCEPT_TOLERANCE * ttft_ref, SLACK_MS)
    slope_error = (fit.slope - tpot_ref) / tpot_ref
    tpots = medians(runs, "tpot_ms")
    tpot_first = next(t for t in tpots if t is not None)
    numbers = {
        "slope_ms_per_token": fit.slope, "intercept_ms": fit.intercept, "r_squared": fit.r_squared,
        "tpot_ref_ms": tpot_ref, "ttft_ref_ms": ttft_ref, "expected_intercept_ms": expected_intercept,
        "intercept_tolerance_ms": intercept_slack, "slope_error": slope_error,
        "tpot_first_ms": tpot_first, "tpot_last_ms": tpots[-1],
    }
    fit_text = (f"E2E = {fit.intercept:.1f} + {fit.slope:.3f}*N ms, R^2 {fit.r_squared:.4f}; "
                f"expected slope TPOT {tpot_ref:.3f}, intercept TTFT-TPOT {expected_intercept:.1f}")
    problems = []
    if fit.r_squared < MIN_R_SQUARED:
        problems.append(f"R^2 below {MIN_R_SQUARED}")
    if abs(slope_error) > SLOPE_TOLERANCE:
        problems.append(f"slope {100 * slope_error:+.0f}% off TPOT")
    if abs(fit.intercept - expected_intercept) > intercept_slack:
        problems.append(f"intercept off by more than {intercept_slack:.1f} ms")
    if not problems:
        return Verdict(LINEAR_LATENCY, HOLDS, numbers, fit_text)
    drift = f"; TPOT p50 {tpot_first:.3f} -> {tpots[-1]:.3f} ms from N={lengths[0]} to N={lengths[-1]}"
    return Verdict(LINEAR_LATENCY, DOES_NOT_HOLD, numbers, f"{fit_text}: {', '.join(problems)}{drift}")


def check_ttft_independent(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]]) -> Verdict:
    """Hypothesis 2: TTFT's fitted change across the sweep, slope * (N_k - N_1), is within max(10%, 1 ms)."""
    lengths, runs = _sorted(output_lengths, runs)
    short = _not_enough(TTFT_INDEPENDENT, len(lengths))
    if short:
        return short
    ttfts = medians(runs, "ttft_ms")
    ttft_ref = float(np.median(ttfts))
    fit = linear_fit(lengths, ttfts)
    change = fit.slope * (lengths[-1] - lengths[0])
    tolerance = max(TTFT_TOLERANCE * ttft_ref, SLACK_MS)
    numbers = {
        "slope_ms_per_token": fit.slope, "change_ms": change, "tolerance_ms": tolerance, "ttft_ref_ms": ttft_ref,
        "relative_spread": (max(ttfts) - min(ttfts)) / ttft_ref if ttft_ref > 0 else 0.0,
    }
    text = (f"TTFT p50 {min(ttfts):.2f}-{max(ttfts):.2f} ms; fitted change from N={lengths[0]} to N={lengths[-1]} "
            f"{change:+.2f} ms ({100 * change / ttft_ref:+.1f}%), tolerance {tolerance:.2f} ms")
    return Verdict(TTFT_INDEPENDENT, HOLDS if abs(change) <= tolerance else DOES_NOT_HOLD, numbers, text)


def check_tokens_plateau(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]]) -> Verdict:
    """Hypothesis 3: R_k >= 1.05 R_1, R_{i+1} >= 0.95 R_i, and R_k / R_{k-1} - 1 < 5%."""
    lengths, runs = _sorted(output_lengths, runs)
    short = _not_enough(TOKENS_PLATEAU, len(lengths))
    if short:
        return short
    rates = medians(runs, "output_tokens_per_s")
    tpot_last = medians(runs, "tpot_ms")[-1]
    total_gain = rates[-1] / rates[0] - 1
    last_gain = rates[-1] / rates[-2] - 1
    worst_step = min(b / a - 1 for a, b in zip(rates, rates[1:]))
    numbers = {
        "tokens_per_s_first": rates[0], "tokens_per_s_last": rates[-1], "total_gain": total_gain,
        "last_step_gain": last_gain, "worst_step_change": worst_step,
        # R_k against 1000 / TPOT_k, the rate it tends to: N / (N + TTFT / TPOT - 1) < 1
        "fraction_of_decode_rate": rates[-1] * tpot_last / 1e3 if tpot_last else None,
    }
    problems = []
    if total_gain < TOKENS_STEP:
        problems.append(f"does not rise (first-to-last gain below {100 * TOKENS_STEP:.0f}%)")
    if worst_step < -TOKENS_STEP:
        problems.append(f"falls by {100 * -worst_step:.0f}% at one step")
    if last_gain >= TOKENS_STEP:
        problems.append(f"still rising at the last step (gain {100 * TOKENS_STEP:.0f}% or more)")
    decode = "" if numbers["fraction_of_decode_rate"] is None else f", {100 * numbers['fraction_of_decode_rate']:.0f}% of its 1/TPOT"
    text = (f"tok/s p50 {rates[0]:.1f} at N={lengths[0]} -> {rates[-1]:.1f} at N={lengths[-1]} ({100 * total_gain:+.0f}%), "
            f"last step {100 * last_gain:+.1f}%{decode}")
    if problems:
        return Verdict(TOKENS_PLATEAU, DOES_NOT_HOLD, numbers, f"{text}: {', '.join(problems)}")
    return Verdict(TOKENS_PLATEAU, HOLDS, numbers, text)


def check_all(output_lengths: Sequence[int], runs: Sequence[Sequence[RunTimes]]) -> tuple[Verdict, ...]:
    """The three hypotheses, in the seed's order."""
    return (
        check_linear_latency(output_lengths, runs),
        check_ttft_independent(output_lengths, runs),
        check_tokens_plateau(output_lengths, runs),
    )
