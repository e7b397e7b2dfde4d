"""The three output-length hypotheses, on runs built by hand with known TTFT and TPOT."""

import pytest

from inferlab.suite.hypotheses import (
    DOES_NOT_HOLD,
    HOLDS,
    NOT_ENOUGH_DATA,
    check_all,
    check_linear_latency,
    check_tokens_plateau,
    check_ttft_independent,
    linear_fit,
)
from inferlab.measure.metrics import RunTimes

LENGTHS = (10, 50, 100, 500)
# Sums of a few hundred exactly representable values: only the last bits can round.
EXACT = dict(rel=1e-12, abs=1e-9)


def runs(ttft_ms: float, step_ms, n: int, repeats: int = 3) -> tuple[RunTimes, ...]:
    """`repeats` identical runs: first token at ttft_ms, then token i at t_{i-1} + step_ms(i)."""
    step = step_ms if callable(step_ms) else (lambda i: step_ms)
    times = [ttft_ms]
    for i in range(1, n):
        times.append(times[-1] + step(i))
    return tuple(RunTimes(tuple(times)) for _ in range(repeats))


def linear_runs(ttft_ms: float, tpot_ms: float, lengths=LENGTHS):
    return [runs(ttft_ms, tpot_ms, n) for n in lengths]


def test_linear_fit_recovers_an_exact_line():
    fit = linear_fit([1, 2, 3, 4], [5.0, 7.0, 9.0, 11.0])
    assert (fit.slope, fit.intercept, fit.r_squared) == pytest.approx((2.0, 3.0, 1.0), **EXACT)


def test_exactly_linear_latency_holds_with_slope_tpot_and_intercept_ttft_minus_tpot():
    verdict = check_linear_latency(LENGTHS, linear_runs(20.0, 5.0))  # E2E = 20 + 5 (N - 1) = 15 + 5 N
    assert verdict.verdict == HOLDS
    numbers = verdict.numbers
    assert numbers["slope_ms_per_token"] == pytest.approx(5.0, **EXACT)
    assert numbers["intercept_ms"] == pytest.approx(15.0, **EXACT)
    assert numbers["r_squared"] == pytest.approx(1.0, **EXACT)
    assert (numbers["tpot_ref_ms"], numbers["ttft_ref_ms"], numbers["expected_intercept_ms"]) == pytest.approx((5.0, 20.0, 15.0), **EXACT)


def test_quadratic_latency_does_not_hold_and_names_tpot_drift():
    # each decode step is slower than the last, as with a cache that is copied at every step
    data = [runs(20.0, lambda i: 5.0 + 0.05 * i, n) for n in LENGTHS]
    verdict = check_linear_latency(LENGTHS, data)
    assert verdict.verdict == DOES_NOT_HOLD
    assert verdict.numbers["r_squared"] > 0.99  # R^2 alone would pass: the slope against TPOT catches the bend
    assert "slope +168% off TPOT" in verdict.explanation
    assert "TPOT p50 5.250 -> 17.500 ms from N=10 to N=500" in verdict.explanation  # 5 + 0.025 N


def test_line_with_the_wrong_intercept_does_not_hold():
    # TTFT grows with N, so E2E is still a perfect line but its intercept is not TTFT_ref - TPOT_ref
    data = [runs(20.0 + 0.2 * n, 5.0, n) for n in LENGTHS]
    verdict = check_linear_latency(LENGTHS, data)
    assert verdict.numbers["r_squared"] == pytest.approx(1.0, **EXACT)
    assert verdict.verdict == DOES_NOT_HOLD and "intercept off" in verdict.explanation


def test_lengths_may_come_in_any_order():
    shuffled = (500, 10, 100, 50)
    assert check_all(shuffled, linear_runs(20.0, 5.0, shuffled)) == check_all(LENGTHS, linear_runs(20.0, 5.0))


def test_ttft_growing_with_output_length_does_not_hold():
    data = [runs(20.0 + 0.1 * n, 5.0, n) for n in LENGTHS]  # 21 ms at N=10, 70 ms at N=500
    verdict = check_ttft_independent(LENGTHS, data)
    assert verdict.verdict == DOES_NOT_HOLD
    assert verdict.numbers["slope_ms_per_token"] == pytest.approx(0.1, **EXACT)
    assert verdict.numbers["change_ms"] == pytest.approx(49.0, **EXACT)


def test_ttft_with_small_noise_holds():
    data = [runs(ttft, 5.0, n) for ttft, n in zip((20.0, 20.6, 19.7, 20.3), LENGTHS)]
    assert check_ttft_independent(LENGTHS, data).verdict == HOLDS


def test_sub_millisecond_ttft_jitter_is_within_the_absolute_slack():
    # TTFT ~2 ms: 10% would be 0.2 ms, but a 0.8 ms change is within the 1 ms floor
    data = [runs(ttft, 1.0, n) for ttft, n in zip((2.0, 2.2, 2.5, 2.8), LENGTHS)]
    verdict = check_ttft_independent(LENGTHS, data)
    assert verdict.numbers["tolerance_ms"] == 1.0
    assert verdict.verdict == HOLDS


def test_tokens_per_s_rising_then_plateauing_holds():
    # R(N) = N / (20 + 5 (N - 1)): 153.8, 188.7, 194.2, 198.8 tok/s (last step +2.4%)
    verdict = check_tokens_plateau(LENGTHS, linear_runs(20.0, 5.0))
    assert verdict.verdict == HOLDS
    assert verdict.numbers["tokens_per_s_first"] == pytest.approx(10 / 65e-3, **EXACT)
    assert verdict.numbers["last_step_gain"] == pytest.approx((500 / 2515) / (100 / 515) - 1, **EXACT)
    assert verdict.numbers["fraction_of_decode_rate"] == pytest.approx(500 / 503, **EXACT)  # N / (N + TTFT/TPOT - 1)


def test_tokens_per_s_still_rising_strongly_does_not_hold():
    verdict = check_tokens_plateau(LENGTHS, linear_runs(1000.0, 1.0))  # a long prefill, not yet amortized
    assert verdict.verdict == DOES_NOT_HOLD and "still rising" in verdict.explanation


def test_tokens_per_s_that_never_rises_does_not_hold():
    verdict = check_tokens_plateau(LENGTHS, linear_runs(5.0, 5.0))  # TTFT = TPOT: flat from the start
    assert verdict.verdict == DOES_NOT_HOLD and "does not rise" in verdict.explanation


def test_tokens_per_s_that_falls_does_not_hold():
    data = linear_runs(20.0, 5.0, LENGTHS[:3]) + [runs(20.0, 6.0, 500)]  # the longest length decodes 20% slower
    verdict = check_tokens_plateau(LENGTHS, data)
    assert verdict.verdict == DOES_NOT_HOLD and "falls by" in verdict.explanation


@pytest.mark.parametrize("lengths", [(), (10,), (10, 50)])
def test_fewer_than_three_lengths_is_not_enough_data(lengths):
    verdicts = check_all(lengths, linear_runs(20.0, 5.0, lengths))
    assert [v.verdict for v in verdicts] == [NOT_ENOUGH_DATA] * 3
    assert all(f"got {len(lengths)}" in v.explanation for v in verdicts)


def test_verdicts_serialize_to_plain_dicts():
    for verdict in check_all(LENGTHS, linear_runs(20.0, 5.0)):
        data = verdict.to_dict()
        assert set(data) == {"name", "verdict", "numbers", "explanation"}
        assert "\n" not in data["explanation"]
