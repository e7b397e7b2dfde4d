"""A saved sweep's raw runs judged again (`sweep.saved_group_verdicts`, perf_tests/scripts/rejudge_sweep.py),
the failed results left out."""

import json
import subprocess
import sys
from pathlib import Path

from inferlab.measure.metrics import RunTimes
from inferlab.suite import hypotheses
from inferlab.suite.sweep import saved_group_verdicts

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "rejudge_sweep.py"
LENGTHS = (10, 50, 100)


def token_ms(ttft: float, tpot: float, n: int) -> list[float]:
    return [ttft + tpot * i for i in range(n)]


def result(engine: str, n: int, tpot: float, status: str = "ok") -> dict:
    runs = [{"token_ms": token_ms(20.0 * f, tpot * f, n), "wall_ms": None} for f in (1.0, 1.01, 0.99)]
    return {"status": status, "config": {"engine": engine, "output_length": n, "batch_size": 1}, "prompt_length": 128,
            "runs": runs if status == "ok" else [], "roofline": {"bytes_per_step": 2.0e9}}


def test_the_verdicts_are_those_of_the_hypotheses_on_the_saved_runs(tmp_path):
    growing = {10: 5.0, 50: 5.5, 100: 7.0}  # TPOT grows 40% with the context
    sweep = {"results": [result("flat", n, 5.0) for n in LENGTHS] + [result("growing", n, growing[n]) for n in LENGTHS]
             + [result("growing", 500, 9.0, status="oom")]}
    flat, growing_group = saved_group_verdicts(sweep)
    assert (flat.engine, flat.prompt_length, flat.batch_size, growing_group.engine) == ("flat", 128, 1, "growing")
    expected = hypotheses.check_all(  # the failed N = 500 is left out
        LENGTHS, [[RunTimes(tuple(r["token_ms"])) for r in result("growing", n, growing[n])["runs"]] for n in LENGTHS],
        [2.0e9] * 3)
    assert growing_group.verdicts == expected and expected[0].verdict == hypotheses.DOES_NOT_HOLD
    assert [v.verdict for v in flat.verdicts] == [hypotheses.HOLDS] * 3

    (tmp_path / "sweep.json").write_text(json.dumps(sweep))
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()[1:]
    assert [line.split()[3] for line in lines if line.startswith("  flat")] == ["HOLDS"] * 3
    assert "growing p128 b1  DOES NOT HOLD   total latency grows linearly" in done.stdout


def test_a_path_without_a_sweep_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "no sweep.json" in done.stderr


def phased(n: int, order: str) -> dict:
    """A saved result of 7 rounds at N = n whose rounds 1 and 2 ran 30% slower (a slow phase of the host)."""
    factors = (1.0, 1.3, 1.3, 1.0, 1.0, 1.0, 1.0)
    wobble = (1.0, 1.004, 0.997, 1.002, 0.998, 1.003, 0.999)  # each run's own noise, the same at every length
    runs = [{"token_ms": token_ms(20.0 * f * w ** (n % 7), 5.0 * f, n), "wall_ms": None} for f, w in zip(factors, wobble)]
    schedule = [{"round": r, "position": (r + n) % 4, "start_s": float(r)} for r in range(len(runs))]
    return {"status": "ok", "config": {"engine": "eager", "output_length": n, "batch_size": 1}, "prompt_length": 128,
            "runs": runs, "roofline": {"bytes_per_step": 2.0e9}, "schedule": schedule}


def test_a_saved_interleaved_sweep_is_judged_paired_by_round_and_a_sequential_one_is_not():
    lengths = (10, 50, 100, 500)
    for order, paired in (("interleaved", True), ("sequential", False)):
        group, = saved_group_verdicts({"config": {"order": order}, "results": [phased(n, order) for n in lengths]})
        assert [v.numbers["paired_by_round"] for v in group.verdicts] == [paired] * 3
        if paired:
            assert [v.verdict for v in group.verdicts] == [hypotheses.HOLDS] * 3, [v.explanation for v in group.verdicts]
