"""The pytest plugin end to end, in separate pytest processes: autosave, compare, compare-fail
on an injected regression, and refusal to compare runs of different set-ups. The cases chosen by
options and a bad option, decided before any case runs, in pytest sessions of their own run in
this process (pytester's in-process runs, a fresh configuration each)."""

import json
import os
from pathlib import Path

import pytest

from inferlab.pytest_plugin import PerfCase, inject_where

ROOT = Path(__file__).resolve().parents[1]

PERF_TEST = '''
import pytest

@pytest.mark.perf
def test_decode(decode_benchmark, inferlab_case):
    runs = decode_benchmark(inferlab_case, model="tiny-random")
    assert all(run.num_tokens == inferlab_case.output_length for run in runs)

@pytest.mark.gpu
def test_needs_a_gpu():
    pass
'''

CONFTEST = '''
import importlib.metadata
_ENTRY_POINTS = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
pytest_plugins = [] if "inferlab.pytest_plugin" in _ENTRY_POINTS else ["inferlab.pytest_plugin"]
'''

SMALL = ["--inferlab-engines", "eager", "--inferlab-output-lengths", "6", "--inferlab-prompt-lengths", "4",
         "--inferlab-rounds", "5", "--inferlab-warmup", "1", "--inferlab-device", "cpu", "-p", "no:cacheprovider"]


@pytest.fixture
def suite(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_perf=PERF_TEST)
    return pytester


def saved_runs(pytester) -> list[Path]:
    return sorted(Path(pytester.path, ".benchmarks").rglob("*.json"))


def test_autosave_writes_one_entry_per_metric_with_raw_rounds_and_the_fingerprint(suite):
    result = suite.runpytest_subprocess(*SMALL, "--benchmark-autosave", "--benchmark-save-data", "-rs")
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA device; none is available here*"])
    [path] = saved_runs(suite)
    run = json.loads(path.read_text())
    assert run["machine_info"]["inferlab"]["device_type"] == "cpu"
    assert run["machine_info"]["inferlab"]["dtype"] == "fp32"
    entries = {b["param"] if "param" in b else b["name"]: b for b in run["benchmarks"]}
    assert len(entries) == 3
    metrics = sorted(b["extra_info"]["metric"] for b in run["benchmarks"])
    assert metrics == ["e2e_ms", "tpot_ms", "ttft_ms"]
    for bench in run["benchmarks"]:
        assert len(bench["stats"]["data"]) == 5  # the measured rounds, raw
        assert bench["extra_info"]["fingerprint"]["engine"] == "eager"
        summary = bench["extra_info"][bench["extra_info"]["metric"]]
        # the entry's own series is that metric, in seconds
        assert bench["stats"]["median"] * 1e3 == pytest.approx(summary["p50"], rel=1e-6)
        # what the requests cost: on the CPU no device peaks, the process's RSS, no energy (with the reason)
        memory, energy = bench["extra_info"]["memory"], bench["extra_info"]["energy"]
        assert memory["peak_allocated_bytes"] is None and memory["peak_rss_bytes"] > 0
        assert memory["weight_bytes"] > 0 and memory["kv_cache_bytes"] > 0
        assert energy["available"] is False and "cpu" in energy["reason"]
    # The three series are the same five requests: TPOT_i = (E2E_i - TTFT_i) / (N - 1) round by round.
    data = {b["extra_info"]["metric"]: b["stats"]["data"] for b in run["benchmarks"]}
    for ttft, tpot, e2e in zip(data["ttft_ms"], data["tpot_ms"], data["e2e_ms"]):
        assert tpot == pytest.approx((e2e - ttft) / (6 - 1), rel=1e-6)


@pytest.mark.timing
def test_compare_fail_catches_an_injected_regression(suite):
    suite.runpytest_subprocess(*SMALL, "--benchmark-autosave", "--benchmark-save-data").assert_outcomes(passed=3, skipped=1)
    slower = suite.runpytest_subprocess(*SMALL, "--benchmark-compare", "--benchmark-compare-fail=median:5%",
                                        "--inferlab-metrics", "tpot_ms", "--inferlab-inject-delay-ms", "20")
    assert slower.ret != 0
    slower.stderr.fnmatch_lines(["Performance has regressed:",
                                 "*eager-b1-p4-n6-tpot_ms*Field 'median' has failed PercentageRegressionCheck*"])


def test_comparing_runs_of_another_dtype_stops_with_a_clear_message(suite):
    suite.runpytest_subprocess(*SMALL, "--benchmark-autosave", "--inferlab-dtype", "fp32").assert_outcomes(passed=3, skipped=1)
    other = suite.runpytest_subprocess(*SMALL, "--benchmark-compare", "--inferlab-dtype", "bf16")
    assert other.ret == pytest.ExitCode.USAGE_ERROR
    other.stderr.fnmatch_lines(["*cannot compare with the saved run: its dtype is 'fp32', this run's is 'bf16'*"])


def test_options_choose_the_cases_without_editing_tests(suite):
    result = suite.runpytest_inprocess(*SMALL[:-6], "--inferlab-output-lengths", "2,3", "--inferlab-rounds", "1",
                                        "--inferlab-warmup", "0", "--inferlab-metrics", "ttft_ms", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_decode[[]eager-b1-p4-n2-ttft_ms[]]*", "*test_decode[[]eager-b1-p4-n3-ttft_ms[]]*"])


def test_a_bad_option_is_a_usage_error(suite):
    result = suite.runpytest_inprocess("--inferlab-engines", "warp-drive", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --inferlab-engines: unknown*warp-drive*use some of eager*"])


class _Graphs:
    class options:
        graphs = True


@pytest.mark.parametrize("option, engine, device, where", [
    ("auto", object(), "cpu", "host"),
    ("auto", _Graphs(), "cpu", "host"),
    ("auto", object(), "cuda", "host"),  # eager: the host is the bottleneck
    ("auto", _Graphs(), "cuda", "device"),  # graph replay: the GPU is
    ("host", _Graphs(), "cuda", "host"),
])
def test_injected_delay_lands_where_the_bottleneck_is(option, engine, device, where):
    import torch

    assert inject_where(option, engine, torch.device(device)) == where


def test_perf_case_ids_name_every_axis():
    assert PerfCase("hf", 128, 50, "tpot_ms", 4).id == "hf-b4-p128-n50-tpot_ms"


@pytest.mark.timing
def test_the_gate_fails_an_injected_regression_and_not_an_unchanged_run(suite, capsys):
    from inferlab.cli import main

    options = [*SMALL, "--inferlab-metrics", "ttft_ms,tpot_ms", "--benchmark-save-data"]
    for name, delay in (("base.json", "0"), ("same.json", "0"), ("slow.json", "20")):
        suite.runpytest_subprocess(*options, f"--benchmark-json={name}", "--inferlab-inject-delay-ms", delay)
    base, same, slow = (str(suite.path / n) for n in ("base.json", "same.json", "slow.json"))
    capsys.readouterr()  # drop the pytest runs' own output

    assert main(["gate", base, slow]) == 1  # 20 ms per step on a ~1 ms step
    table = capsys.readouterr().out
    assert [line.split()[-1] for line in table.splitlines() if "tpot_ms]" in line and " median " in line] == ["FAIL"]
    # A/A with this CPU's process-to-process spread (~25% measured by gate_experiment.py) declared:
    assert main(["gate", base, same, "--run-noise", "0.3"]) != 1
