"""The three output-length hypotheses, on runs built by hand with known TTFT, TPOT and noise."""

import numpy as np
import pytest

from inferlab.measure.metrics import RunTimes
from inferlab.suite import sweep
from inferlab.suite.hypotheses import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    MIN_RUNS,
    NOT_ENOUGH_DATA,
    Interval,
    bootstrap,
    check_all,
    check_linear_latency,
    check_tokens_plateau,
    check_ttft_independent,
    PAIRED_MIN_ROUNDS,
    decide,
    fit_line,
    rounds_paired,
    run_values,
    runs_to_decide,
)

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


def linear_runs(ttft_ms: float, tpot_ms: float, lengths=LENGTHS, repeats: int = 3):
    return [runs(ttft_ms, tpot_ms, n, repeats) for n in lengths]


def noisy_runs(ttft_ms, tpot_ms, repeats: int, noise: float, seed: int = 0, lengths=LENGTHS):
    """Each run's TTFT and TPOT scaled by its own factor ~ N(1, noise) (a run-wide slowdown)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        factors = rng.normal(1.0, noise, size=repeats)
        ttft = ttft_ms(n) if callable(ttft_ms) else ttft_ms
        out.append(tuple(runs(ttft * f, tpot_ms * f, n, 1)[0] for f in factors))
    return out


def test_fit_line_recovers_an_exact_line_along_the_last_axis():
    slope, intercept = fit_line(np.array([1.0, 2, 3, 4]), np.array([[5.0, 7, 9, 11], [1.0, 1, 1, 1]]))
    assert slope.tolist() == pytest.approx([2.0, 0.0], **EXACT) and intercept.tolist() == pytest.approx([3.0, 1.0], **EXACT)


def test_bootstrap_of_identical_runs_is_the_point_and_repeats_with_its_seed():
    values = [run_values(r) for r in linear_runs(20.0, 5.0)]
    interval = bootstrap(values, lambda m: m[..., 0].mean(axis=-1), seed=0)
    assert interval == Interval(20.0, 20.0, 20.0)
    noisy = [run_values(r) for r in noisy_runs(20.0, 5.0, 5, 0.05)]
    first = bootstrap(noisy, lambda m: m[..., 0].mean(axis=-1), seed=7)
    assert first == bootstrap(noisy, lambda m: m[..., 0].mean(axis=-1), seed=7)
    assert first.low < first.estimate < first.high


@pytest.mark.parametrize("interval, verdict", [
    (Interval(0.0, -0.05, 0.05), HOLDS),
    (Interval(0.3, 0.2, 0.4), DOES_NOT_HOLD),
    (Interval(-0.3, -0.4, -0.2), DOES_NOT_HOLD),
    (Interval(0.08, 0.02, 0.14), INCONCLUSIVE),
])
def test_decide_holds_inside_fails_outside_and_is_inconclusive_across_a_bound(interval, verdict):
    assert decide(interval, -0.1, 0.1) == verdict


def test_runs_to_decide_scales_the_runs_by_the_square_of_half_width_over_distance():
    # estimate 0.08, bound 0.1: distance 0.02; half-width towards it 0.06: 5 * (0.06 / 0.02)^2 = 45
    assert runs_to_decide(Interval(0.08, 0.02, 0.14), -0.1, 0.1, 5) == 45
    # on the wrong side: estimate 0.12 beyond 0.1, the lower half-width 0.04 must shrink below 0.02
    assert runs_to_decide(Interval(0.12, 0.08, 0.2), -0.1, 0.1, 5) == 20
    assert runs_to_decide(Interval(0.1, 0.05, 0.15), -0.1, 0.1, 5) is None  # on the bound


def test_honest_constant_ttft_and_tpot_hold_all_three():
    data = noisy_runs(20.0, 5.0, repeats=10, noise=0.02, seed=1)
    verdicts = check_all(LENGTHS, data)
    assert [v.verdict for v in verdicts] == [HOLDS, HOLDS, HOLDS], [v.explanation for v in verdicts]


def test_tpot_growing_by_exactly_the_kv_cache_prediction_holds():
    # bytes per step = weights + kv * (P + N/2) with P = 100: TPOT proportional to it
    weights, kv, prompt = 1000.0, 2.0, 100
    bytes_per_step = [weights + kv * (prompt + n / 2) for n in LENGTHS]
    data = [runs(20.0, 0.005 * b, n) for n, b in zip(LENGTHS, bytes_per_step)]
    verdict = check_linear_latency(LENGTHS, data, bytes_per_step)
    assert verdict.verdict == HOLDS
    predicted = bytes_per_step[-1] / bytes_per_step[0] - 1  # (1000 + 1000) / (1000 + 210) - 1
    assert verdict.numbers["predicted_growth"] == pytest.approx(predicted, **EXACT)
    assert verdict.numbers["measured_growth"] == pytest.approx(predicted, **EXACT)
    # without the prediction the same data grows +65%: it would not hold
    assert check_linear_latency(LENGTHS, data).verdict == DOES_NOT_HOLD


def test_tpot_growing_with_the_context_beyond_the_prediction_does_not_hold_and_names_both_growths():
    # each decode step slower than the last: TPOT(N) = mean of 5 + 0.05 i over 0 < i < N = 5 + 0.025 N
    data = [runs(20.0, lambda i: 5.0 + 0.05 * i, n) for n in LENGTHS]
    bytes_per_step = [1000.0 + 0.01 * n for n in LENGTHS]  # the KV cache explains almost nothing
    verdict = check_linear_latency(LENGTHS, data, bytes_per_step)
    assert verdict.verdict == DOES_NOT_HOLD
    measured = 0.025 * 490 / (5 + 0.025 * 10)
    assert verdict.numbers["measured_growth"] == pytest.approx(measured, rel=1e-9)
    assert f"fitted growth {100 * measured:+.1f}%, the KV cache predicts +0.5%" in verdict.explanation  # 4.9 / 1000.1
    assert "TPOT p50 5.250 -> 17.500 ms from N=10 to N=500" in verdict.explanation


def test_ttft_growing_with_output_length_does_not_hold():
    data = [runs(20.0 + 0.1 * n, 5.0, n) for n in LENGTHS]  # 21 ms at N=10, 70 ms at N=500
    verdict = check_ttft_independent(LENGTHS, data)
    assert verdict.verdict == DOES_NOT_HOLD
    assert verdict.numbers["change_ms"] == pytest.approx(49.0, **EXACT)
    assert "fitted change from N=10 to N=500 +49.00 ms" in verdict.explanation


def test_ttft_with_small_noise_holds():
    data = [runs(ttft, 5.0, n) for ttft, n in zip((20.0, 20.6, 19.7, 20.3), LENGTHS)]
    assert check_ttft_independent(LENGTHS, data).verdict == HOLDS


def test_sub_millisecond_ttft_jitter_is_within_the_absolute_slack():
    # TTFT ~2 ms: 10% would be 0.2 ms, but a 0.8 ms change is within the 1 ms floor
    data = [runs(ttft, 1.0, n) for ttft, n in zip((2.0, 2.2, 2.5, 2.8), LENGTHS)]
    verdict = check_ttft_independent(LENGTHS, data)
    assert verdict.numbers["tolerance_ms"] == 1.0
    assert verdict.verdict == HOLDS


def test_tokens_per_s_rising_then_plateauing_holds_and_reports_how_close_to_the_plateau():
    # R(N) = N / (20 + 5 (N - 1)): 153.8, 188.7, 194.2, 198.8 tok/s
    verdict = check_tokens_plateau(LENGTHS, linear_runs(20.0, 5.0))
    assert verdict.verdict == HOLDS
    assert verdict.numbers["tokens_per_s_first"] == pytest.approx(10 / 65e-3, **EXACT)
    assert verdict.numbers["fraction_of_decode_rate"] == pytest.approx(500 / 503, **EXACT)  # N / (N + TTFT/TPOT - 1)


def test_tokens_per_s_flat_from_the_start_holds():
    # TTFT = TPOT (an eager loop on a GPU): nothing to amortize, already at its plateau at N = 10
    verdict = check_tokens_plateau(LENGTHS, linear_runs(5.0, 5.0))
    assert verdict.verdict == HOLDS and verdict.numbers["total_gain"] == pytest.approx(0.0, abs=1e-12)


def test_tokens_per_s_that_falls_does_not_hold():
    data = linear_runs(20.0, 5.0, LENGTHS[:3]) + [runs(20.0, 6.0, 500)]  # the longest length decodes 20% slower
    verdict = check_tokens_plateau(LENGTHS, data)
    assert verdict.verdict == DOES_NOT_HOLD
    assert verdict.numbers["worst_step_change"] == pytest.approx((500 / 3014) / (100 / 515) - 1, **EXACT)


def bimodal_runs(tpot_ms, repeats: int, seed: int, slow: float = 1.45, lengths=LENGTHS):
    """An eager engine on a GPU host: each run is either fast or `slow` x slower, at random (H100: 14 or 20 ms)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        factors = np.where(rng.random(repeats) < 0.5, slow, 1.0) * rng.normal(1.0, 0.05, size=repeats)
        tpot = tpot_ms(n) if callable(tpot_ms) else tpot_ms
        out.append(tuple(runs(17.0 * f, tpot * f, n, 1)[0] for f in factors))
    return out


def test_a_bimodal_host_does_not_make_an_unchanged_engine_fall():
    # The minimum of three noisy steps judged at 95% called this a fall in ~15% of sweeps; each
    # step judged on its own, at the family's confidence for a fall, keeps it near the 2.5% asked.
    verdicts = [check_tokens_plateau(LENGTHS, bimodal_runs(14.0, 5, seed), seed=seed).verdict for seed in range(40)]
    assert verdicts.count(DOES_NOT_HOLD) <= 1 and INCONCLUSIVE in verdicts


def test_a_fall_among_noisy_runs_is_caught_and_names_its_step():
    data = noisy_runs(20.0, 5.0, repeats=5, noise=0.02, seed=1)[:3] + noisy_runs(20.0, 6.0, 5, 0.02, 2, (500,))
    verdict = check_tokens_plateau(LENGTHS, data)
    assert verdict.verdict == DOES_NOT_HOLD
    assert verdict.numbers["shown_step"] == [100, 500] and len(verdict.numbers["step_changes"]) == 3
    assert verdict.numbers["confidence"] == pytest.approx(1 - 0.05 / 3) and "step N=100->500" in verdict.explanation


def test_too_few_runs_are_inconclusive_whatever_the_numbers():
    data = [runs(20.0 + 0.1 * n, 5.0, n, repeats=2) for n in LENGTHS]  # a clear effect, but 2 runs per length
    verdicts = check_all(LENGTHS, data)
    assert [v.verdict for v in verdicts] == [INCONCLUSIVE] * 3
    assert all(f"needs at least {MIN_RUNS} per length" in v.explanation for v in verdicts)
    assert verdicts[1].numbers["change_ms"] == pytest.approx(49.0, **EXACT)  # the estimate is still reported


def test_noisy_runs_near_the_tolerance_are_inconclusive_and_say_how_many_runs_would_decide():
    # TTFT rises by 12% of 20 ms across the sweep (tolerance 10%), each run +-10% noise, 3 runs
    def ttft(n):
        return 20.0 + 2.4 * (n - 10) / 490

    verdict = check_ttft_independent(LENGTHS, noisy_runs(ttft, 5.0, repeats=3, noise=0.10, seed=3))
    assert verdict.verdict == INCONCLUSIVE
    needed = verdict.numbers["runs_to_decide"]
    assert needed > 3 and f"about {needed} runs per length would decide it" in verdict.explanation


def test_host_drift_with_sequential_order_is_misread_and_the_interleaved_order_cures_it():
    # The host slows by 30% over the sweep (TTFT 20 -> 26 ms, as seen on the H200); TTFT and TPOT
    # do not depend on N at all. Run t of the sweep's order runs at 1 + 0.3 t / T times its speed.
    def measured(order):
        slots = sweep.measurement_order(len(LENGTHS), 10, order, seed=0)
        rng = np.random.default_rng(1)
        data = [[] for _ in LENGTHS]
        for t, slot in enumerate(slots):
            factor = (1 + 0.3 * t / len(slots)) * rng.normal(1.0, 0.02)
            data[slot.config] += runs(20.0 * factor, 5.0 * factor, LENGTHS[slot.config], 1)
        return check_all(LENGTHS, data)

    sequential, interleaved = measured("sequential"), measured("interleaved")
    assert [v.verdict for v in sequential[:2]] == [DOES_NOT_HOLD, DOES_NOT_HOLD]
    assert [v.verdict for v in interleaved[:2]] == [HOLDS, HOLDS]
    assert DOES_NOT_HOLD not in {v.verdict for v in interleaved}


def test_lengths_may_come_in_any_order():
    shuffled = (500, 10, 100, 50)
    bytes_per_step = {n: 1000.0 + n for n in LENGTHS}
    assert check_all(shuffled, linear_runs(20.0, 5.0, shuffled), [bytes_per_step[n] for n in shuffled]) == check_all(
        LENGTHS, linear_runs(20.0, 5.0), [bytes_per_step[n] for n in LENGTHS])


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


def test_a_higher_confidence_widens_every_interval_and_is_named_in_its_line():
    data = noisy_runs(20.0, 5.0, repeats=8, noise=0.05, seed=2)
    usual, strict = check_all(LENGTHS, data), check_all(LENGTHS, data, confidence=0.99)
    for a, b in zip(usual[:2], strict[:2]):
        assert a.numbers["estimate"] == b.numbers["estimate"]  # the same statistic, on the same resamples
        assert b.numbers["ci_low"] <= a.numbers["ci_low"] and a.numbers["ci_high"] <= b.numbers["ci_high"]
    assert [v.numbers["confidence"] for v in usual[:2]] == [0.95, 0.95]
    assert [v.numbers["confidence"] for v in strict[:2]] == [0.99, 0.99]
    assert "(95% CI" in usual[0].explanation and "(99% CI" in strict[0].explanation
    # the tokens/s steps share it: each step at 99%, a fall at 1 - 0.01 / 3
    assert strict[2].numbers["confidence"] in (0.99, pytest.approx(1 - 0.01 / 3))


def phased_runs(ttft_ms, tpot_ms, slow_rounds, noise: float = 0.01, seed: int = 0, lengths=LENGTHS):
    """Run j of every length in round j; a round in `slow_rounds` is 30% slower for every length of
    it (the host's slow phase), each run besides scaled by its own N(1, noise)."""
    rng = np.random.default_rng(seed)
    rounds = len(slow_rounds)
    out = []
    for n in lengths:
        factors = np.asarray(slow_rounds, dtype=float) * rng.normal(1.0, noise, size=rounds)
        ttft = ttft_ms(n) if callable(ttft_ms) else ttft_ms
        out.append(tuple(runs(ttft * f, tpot_ms * f, n, 1)[0] for f in factors))
    return out


# The slow and fast phases of a 2-core host: rounds 1 and 2 of 7 slower for every length
PHASES = (1.0, 1.3, 1.3, 1.0, 1.0, 1.0, 1.0)
ROUNDS = [tuple(range(len(PHASES)))] * len(LENGTHS)


def test_a_host_slow_in_phases_is_undecided_over_runs_and_decided_paired_by_round():
    data = phased_runs(20.0, 5.0, PHASES)
    over_runs, by_round = check_all(LENGTHS, data), check_all(LENGTHS, data, rounds=ROUNDS)
    assert INCONCLUSIVE in [v.verdict for v in over_runs]
    assert [v.verdict for v in by_round] == [HOLDS] * 3, [v.explanation for v in by_round]
    assert all(v.numbers["paired_by_round"] and v.explanation.endswith("runs paired by round") for v in by_round)
    assert not any(v.numbers["paired_by_round"] or "paired" in v.explanation for v in over_runs)
    # the interval is the spread of the median over rounds: narrower than over runs
    assert by_round[1].numbers["ci_high"] - by_round[1].numbers["ci_low"] < (
        over_runs[1].numbers["ci_high"] - over_runs[1].numbers["ci_low"]) / 3


def test_paired_by_round_still_catches_ttft_and_tpot_that_depend_on_n():
    def ttft(n):
        return 20.0 * (1 + 0.3 * (n - 10) / 490)  # +30% across the sweep, tolerance 10%

    verdict = check_ttft_independent(LENGTHS, phased_runs(ttft, 5.0, PHASES), rounds=ROUNDS)
    assert verdict.verdict == DOES_NOT_HOLD and verdict.numbers["change_ms"] == pytest.approx(6.0, rel=0.1)
    data = phased_runs(20.0, 5.0, PHASES)[:3] + phased_runs(20.0, 6.5, PHASES, seed=1, lengths=(500,))
    linear, _, plateau = check_all(LENGTHS, data, rounds=ROUNDS)
    assert linear.verdict == DOES_NOT_HOLD and plateau.verdict == DOES_NOT_HOLD
    assert plateau.numbers["shown_step"] == [100, 500]


def test_one_stalled_run_moves_neither_its_rounds_slowness_nor_its_lengths_median():
    data = [list(r) for r in phased_runs(20.0, 5.0, PHASES)]
    data[0][3] = runs(20.0 * 3, 5.0 * 3, LENGTHS[0], 1)[0]  # round 3's run at N = 10 three times slower
    verdicts = check_all(LENGTHS, data, rounds=ROUNDS)
    assert [v.verdict for v in verdicts] == [HOLDS] * 3, [v.explanation for v in verdicts]


@pytest.mark.parametrize("rounds, counts, paired", [
    ([(0, 1, 2, 3, 4)] * 4, [5] * 4, True),
    ([(0, 2, 3, 5, 6)] * 4, [5] * 4, True),  # top-up rounds skip numbers: the same rounds is what counts
    ([(0, 1, 2, 3)] * 4, [4] * 4, False),  # fewer than PAIRED_MIN_ROUNDS
    ([(0, 1, 2, 3, 4)] * 3 + [(0, 1, 2, 3, 5)], [5] * 4, False),  # one length ran in another round
    ([(0, 1, 2, 3, 4)] * 3 + [(1, 0, 2, 3, 4)], [5] * 4, False),  # in another order
    ([(0, 1, 2, 3, 4)] * 4, [5, 5, 5, 4], False),  # a round list that is not its runs'
    (None, [5] * 4, False),
])
def test_runs_are_paired_only_where_every_length_ran_in_the_same_rounds(rounds, counts, paired):
    assert PAIRED_MIN_ROUNDS == 5 and rounds_paired(rounds, counts) is paired


def test_rounds_that_do_not_pair_leave_the_verdicts_as_over_runs():
    data = phased_runs(20.0, 5.0, PHASES)
    unpaired = [ROUNDS[0]] * 3 + [tuple(reversed(ROUNDS[0]))]
    assert check_all(LENGTHS, data, rounds=unpaired) == check_all(LENGTHS, data)
    shuffled = (500, 10, 100, 50)  # lengths in any order: their rounds go with them
    by_length = dict(zip(LENGTHS, data))
    assert check_all(shuffled, [by_length[n] for n in shuffled], rounds=ROUNDS) == check_all(LENGTHS, data, rounds=ROUNDS)
