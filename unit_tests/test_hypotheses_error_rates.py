"""perf_tests/scripts/hypotheses_error_rates.py: the simulated sweeps it judges, and its --paired table."""

import pytest

from inferlab.suite import hypotheses


@pytest.fixture(scope="module")
def script(perf_script):
    return perf_script("hypotheses_error_rates")


def test_a_slow_phase_slows_every_length_of_its_round_alike(script):
    case = script.Case("normal", 0.0, phases=0.5, ttft_ms=100.0, tpot_ms=10.0)  # no noise of the run's own
    drawn = script.sweep(3, case, repeats=8)
    ttfts = [[run.ttft_ms for run in runs] for runs in drawn]  # [length][round]
    assert all(t == pytest.approx(ttfts[0], rel=1e-12) for t in ttfts)  # the same rounds slow at every length
    assert set(round(t, 6) for t in ttfts[0]) == {100.0, 130.0}
    assert script.Case("stalls", 0.03, ttft_growth=0.15).holds == (True, False, True)


def test_paired_table_judges_each_sweep_over_runs_and_paired_by_round(script):
    outcomes = script.judged_paired((0, script.cpu_case("normal", phases=0.3), 3, 6, hypotheses.PAIRED_MIN_ROUNDS))
    assert set(outcomes) == {f"{pairing}: {rule}" for pairing in ("runs", "rounds")
                             for rule in ("fixed 3", "fixed 6", "top-up 3->6")}
    # below PAIRED_MIN_ROUNDS rounds the two are the same judgement
    assert hypotheses.PAIRED_MIN_ROUNDS > 3 and outcomes["runs: fixed 3"] == outcomes["rounds: fixed 3"]


def test_pairing_starts_at_the_rounds_asked_for(script):
    case = script.cpu_case("normal", phases=0.5)
    from_three = [script.judged_paired((seed, case, 3, 3, 3)) for seed in range(10)]
    assert any(o["runs: fixed 3"] != o["rounds: fixed 3"] for o in from_three)


def test_the_paired_mode_prints_a_row_per_case_and_rule(script, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["hypotheses_error_rates.py", "--paired", "--sweeps", "2", "--workers", "1",
                                     "--max-runs", "5"])
    assert script.main() == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| N(1")]
    assert len(rows) == 8 * 6 and sum("phases 30% x1.3" in row for row in rows) == 5 * 6
