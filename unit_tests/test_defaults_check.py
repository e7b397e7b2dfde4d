"""perf_tests/scripts/defaults_check.py: the delay it injects, the rows it keeps, the table it writes,
and one CPU pass of its suite, gate and sweep steps (tiny model, a few seconds each)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferlab.suite import gate
from inferlab.suite.gate import simulate

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "defaults_check.py"


@pytest.fixture(scope="module")
def check(perf_script):
    return perf_script("defaults_check")


def saved(tmp_path, rounds_ms: dict) -> gate.Run:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(simulate.saved_run(rounds_ms, node="n", device_name="D", when="2026-12-01T00:00:00",
                                                  commit="c")))
    return gate.load_run(path)


def test_the_delay_is_the_fraction_of_the_slowest_tpot_entry(check, tmp_path):
    run = saved(tmp_path, {"fast-b1-p128-n10-tpot_ms": [0.70] * 5, "fast-b1-p128-n50-tpot_ms": [0.72] * 5,
                           "fast-b1-p512-n10-tpot_ms": [0.90, 0.91, 0.90] * 2, "fast-b1-p128-n10-ttft_ms": [2.0] * 5})
    assert check.injection_delay_ms(run, 0.05) == pytest.approx(0.05 * 0.90)  # every entry slows by >= 5%
    with pytest.raises(SystemExit, match="no tpot_ms entry"):
        check.injection_delay_ms(saved(tmp_path, {"fast-b1-p128-n10-ttft_ms": [2.0] * 5}), 0.05)


def test_the_table_names_cases_verdicts_and_the_injected_fraction(check):
    records = [
        {"step": "suite-inject-1", "exit": 0, "wall_s": 61.2, "delay_ms": 0.036,
         "delay_fraction_per_entry": {"a": 0.05, "b": 0.044}},
        {"step": "gate-1", "pairs": {"A/A": {"exit": 0, "wall_s": 3.0, "rows": [
            {"name": "test_decode_latency_gpu[fast-b1-p128-n10-tpot_ms]", "ratio": 1.0001, "verdict": "PASS"}]}}},
        {"step": "sweep-1", "exit": 0, "wall_s": 200.0, "verdicts": {"fast p128 b1": {"TTFT does not depend": "holds"}},
         "prepare_ms": {"fast n10": 7200.0, "eager n10": 1.0}},
    ]
    table = check.summary_markdown(records)
    assert "| suite-inject-1 | 0 | 61 s | +0.0360 ms a step (4.4-5.0% of TPOT) |" in table
    assert "| gate-1 A/A | 0 | 3 s | fast-b1-p128-n10-tpot_ms PASS (1.0001) |" in table
    assert "fast p128 b1: TTFT=holds; fast prepare: fast n10 7.2 s |" in table


def test_a_step_is_expected_to_take_as_long_as_the_longest_finished_one_of_its_kind(check):
    records = [{"step": "sweep-1", "exit": 0, "wall_s": 239.0}, {"step": "sweep-inject-1", "exit": 0, "wall_s": 259.0},
               {"step": "sweep-2", "exit": "timeout", "wall_s": 62.0}, {"step": "suite-1", "exit": 0, "wall_s": 131.0},
               {"step": "gate-1", "pairs": {}}]
    assert check.expected_wall_s(records, "sweep") == 259.0  # the injected sweep counts; the one cut off does not
    assert check.expected_wall_s(records, "suite-inject") == 131.0
    assert check.expected_wall_s(records, "gate") is None and check.expected_wall_s([], "sweep") is None


def test_unknown_steps_are_refused_with_the_list(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--steps", "suite,bogus"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 2 and "unknown ['bogus']" in done.stderr


def test_a_cpu_pass_saves_runs_gates_them_and_never_reuses_a_name(tmp_path):
    argv = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--marker", "perf and not slow", "--device", "cpu",
            "--suite-args", "perf_tests/test_decode_cpu.py -k 'tiny and eager and n8'",
            "--sweep-args", "tiny-random --engines eager --output-lengths 4 8 --runs 3 --warmup 0 --no-probe"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    first = subprocess.run([*argv, "--steps", "suite,suite,suite-inject,gate"], capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run([*argv, "--steps", "suite,sweep"], capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    third = subprocess.run([*argv, "--steps", "suite", "--budget-s", "0.5"], capture_output=True, text=True, env=env)
    assert third.returncode == 0 and "suite: skipped, needs ~" in third.stdout  # it would not fit: not started
    steps = sorted(p.stem for p in (tmp_path / "steps").glob("*.json"))
    assert steps == ["gate-1", "suite-1", "suite-2", "suite-3", "suite-inject-1", "sweep-1"]
    assert len(list((tmp_path / "benchmarks").rglob("*.json"))) == 4
    summary = json.loads((tmp_path / "summary.json").read_text())["steps"]
    gate_step = next(s for s in summary if s["step"] == "gate-1")
    assert set(gate_step["pairs"]) == {"A/A", "injected"}
    assert all(pair["rows"] for pair in gate_step["pairs"].values())
    suite_step = next(s for s in summary if s["step"] == "suite-1")
    assert set(suite_step["prepare_ms"]) == {"eager-b1-p16-n8"} and suite_step["prepare_ms"]["eager-b1-p16-n8"] > 0
    sweep_step = next(s for s in summary if s["step"] == "sweep-1")
    assert sweep_step["complete"] is True and "eager p128 b1" in sweep_step["verdicts"]
    assert "| sweep-1 | 0 |" in (tmp_path / "summary.md").read_text()
