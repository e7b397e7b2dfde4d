"""The default GPU suite's cases and its time budget, checked on the CPU with tiny-random in
separate pytest processes; what is decided before any case runs (the cases collected, options
refused) in pytest sessions of their own run in this process (pytester's in-process runs, a
fresh configuration each, without the seconds a process takes to import torch and transformers)."""

import json
import os
from pathlib import Path

import pytest

from inferlab.suite import pytest_plugin

ROOT = Path(__file__).resolve().parents[1]

CASE_TEST = '''
def test_decode(decode_benchmark, inferlab_case):
    runs = decode_benchmark(inferlab_case, model="tiny-random")
    assert all(run.num_tokens == inferlab_case.output_length for run in runs)
'''

CONFTEST = '''
import importlib.metadata
_ENTRY_POINTS = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
pytest_plugins = [] if "inferlab.pytest_plugin" in _ENTRY_POINTS else ["inferlab.pytest_plugin"]
'''

CPU = ["--inferlab-device", "cpu", "-p", "no:cacheprovider"]
TINY = ["--inferlab-output-lengths", "4", "--inferlab-prompt-lengths", "4"]


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=CASE_TEST)
    return pytester


def saved_entries(pytester) -> list[dict]:
    [path] = sorted(Path(pytester.path, ".benchmarks").rglob("*.json"))
    return json.loads(path.read_text())["benchmarks"]


def test_the_defaults_are_the_seeds_lengths_both_prompts_and_the_fast_engine():
    assert pytest_plugin.DEFAULT_ENGINES == ("fast",)
    assert pytest_plugin.DEFAULT_OUTPUT_LENGTHS == (10, 50, 100, 500)
    assert pytest_plugin.DEFAULT_PROMPT_LENGTHS == (128, 512)
    assert (pytest_plugin.DEFAULT_ROUNDS, pytest_plugin.DEFAULT_MIN_ROUNDS) == (10, 3)
    assert pytest_plugin.DEFAULT_MAX_SECONDS > 0 and pytest_plugin.DEFAULT_WARMUP >= 1


def test_the_default_cases_are_collected_without_options(suite):
    result = suite.runpytest_inprocess(*CPU, "--collect-only", "-q")
    ids = {line.split("[")[1].rstrip("]") for line in result.stdout.lines if "test_decode[" in line}
    assert ids == {f"fast-b1-p{p}-n{n}-{m}" for p in (128, 512)
                   for n in (10, 50, 100, 500) for m in ("ttft_ms", "tpot_ms", "e2e_ms")}


def test_default_engines_and_rounds_run_on_the_cpu_and_record_the_budget(suite):
    result = suite.runpytest_subprocess(*CPU, *TINY, "--benchmark-autosave", "--benchmark-save-data")
    result.assert_outcomes(passed=3)  # the fast engine, three metrics
    entries = saved_entries(suite)
    assert {e["extra_info"]["fingerprint"]["engine"] for e in entries} == {"fast"}
    for entry in entries:
        info = entry["extra_info"]
        assert len(entry["stats"]["data"]) == info["rounds_measured"]
        assert 3 <= info["rounds_measured"] <= 10
        assert (info["rounds_asked"], info["max_seconds"], info["warmup_rounds"]) == (10, 5.0, 1)
        assert info["prepare_ms"] > 0  # the engine's preparation, kept apart from every timed round


def test_costs_off_saves_the_entries_without_an_energy_block(suite):
    result = suite.runpytest_subprocess(*CPU, *TINY, "--inferlab-engines", "eager", "--inferlab-metrics", "tpot_ms",
                                        "--inferlab-costs", "off", "--benchmark-autosave", "--benchmark-save-data")
    result.assert_outcomes(passed=1)
    [entry] = saved_entries(suite)
    info = entry["extra_info"]
    assert info["energy"] == {"available": False, "reason": "not measured: --inferlab-costs off"}
    assert info["memory"]["weight_bytes"] > 0


def test_costs_takes_on_or_off_only(suite):
    result = suite.runpytest_inprocess(*CPU, *TINY, "--inferlab-costs", "maybe")
    assert result.ret != 0
    assert "--inferlab-costs: invalid choice: 'maybe'" in result.stderr.str()


@pytest.mark.parametrize("seconds, rounds", [("1e-9", 3), ("0", 10)])
def test_a_spent_budget_stops_at_the_minimum_rounds_and_no_budget_runs_them_all(suite, seconds, rounds):
    result = suite.runpytest_subprocess(*CPU, *TINY, "--inferlab-engines", "eager", "--inferlab-metrics", "tpot_ms",
                                        "--inferlab-max-seconds", seconds, "--benchmark-autosave", "--benchmark-save-data")
    result.assert_outcomes(passed=1)
    [entry] = saved_entries(suite)
    assert len(entry["stats"]["data"]) == entry["extra_info"]["rounds_measured"] == rounds


@pytest.mark.parametrize("option, message", [
    (["--inferlab-min-rounds", "0"], "--inferlab-min-rounds must be at least 1"),
    (["--inferlab-max-seconds", "-1"], "--inferlab-max-seconds must be 0 or more"),
])
def test_bad_budget_options_are_usage_errors(suite, option, message):
    result = suite.runpytest_inprocess(*CPU, *option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
