"""perf_tests/scripts/rejudge_sweep.py: a saved sweep's raw runs judged again, the failed results left out."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.measure.metrics import RunTimes
from inferlab.suite import hypotheses

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "rejudge_sweep.py"
LENGTHS = (10, 50, 100)


@pytest.fixture(scope="module")
def rejudge():
    spec = importlib.util.spec_from_file_location("rejudge_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def token_ms(ttft: float, tpot: float, n: int) -> list[float]:
    return [ttft + tpot * i for i in range(n)]


def result(engine: str, n: int, tpot: float, status: str = "ok") -> dict:
    runs = [{"token_ms": token_ms(20.0 * f, tpot * f, n), "wall_ms": None} for f in (1.0, 1.01, 0.99)]
    return {"status": status, "config": {"engine": engine, "output_length": n, "batch_size": 1}, "prompt_length": 128,
            "runs": runs if status == "ok" else [], "roofline": {"bytes_per_step": 2.0e9}}


def test_the_verdicts_are_those_of_the_hypotheses_on_the_saved_runs(rejudge, tmp_path):
    growing = {10: 5.0, 50: 5.5, 100: 7.0}  # TPOT grows 40% with the context
    sweep = {"results": [result("flat", n, 5.0) for n in LENGTHS] + [result("growing", n, growing[n]) for n in LENGTHS]
             + [result("growing", 500, 9.0, status="oom")]}
    found = rejudge.groups(sweep)
    assert sorted(found) == [("flat", 128, 1), ("growing", 128, 1)] and len(found[("growing", 128, 1)]) == 3
    expected = hypotheses.check_all(
        LENGTHS, [[RunTimes(tuple(r["token_ms"])) for r in result("growing", n, growing[n])["runs"]] for n in LENGTHS],
        [2.0e9] * 3)
    assert rejudge.judge(found[("growing", 128, 1)]) == expected
    assert expected[0].verdict == hypotheses.DOES_NOT_HOLD
    assert [v.verdict for v in rejudge.judge(found[("flat", 128, 1)])] == [hypotheses.HOLDS] * 3

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
