"""perf_tests/scripts/hypotheses_error_rates.py: the simulated sweeps it judges, and its --paired table."""

import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.suite import hypotheses

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "hypotheses_error_rates.py"


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
    job = (0, script.cpu_case("normal", phases=0.3), 3, 6)
    outcomes = script.judged_paired(job)
    assert set(outcomes) == {f"{pairing}: {rule}" for pairing in ("runs", "rounds")
                             for rule in ("fixed 3", "fixed 6", "top-up 3->6")}
    # below PAIRED_MIN_ROUNDS rounds the two are the same judgement
    assert hypotheses.PAIRED_MIN_ROUNDS > 3 and outcomes["runs: fixed 3"] == outcomes["rounds: fixed 3"]


def test_the_paired_mode_prints_a_row_per_case_and_rule(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--paired", "--sweeps", "2", "--workers", "1", "--max-runs", "5"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| N(1")]
    assert len(rows) == 8 * 6 and sum("phases 30% x1.3" in row for row in rows) == 5 * 6
