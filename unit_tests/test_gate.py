"""The merge gate: verdicts on synthetic runs with known answers, and one-line errors for bad input.

Runs are built by hand in pytest-benchmark's JSON format (round times in seconds under
stats["data"]) and written to tmp_path. Round times are a known median times exp(noise),
noise ~ Normal(0, spread) from a seeded generator, so every verdict below is deterministic.
"""

import json
import math
import os
import statistics

import numpy as np
import pytest

from inferlab.suite import gate
from inferlab.cli import main
from inferlab.errors import UsageError

MACHINE = {
    "device_type": "cpu", "device_name": "Test CPU", "device_count": 1, "driver": None, "cuda": None,
    "torch": "2.x", "transformers": "5.x", "model": "each test's own", "dtype": "fp32", "layout": "single",
}
SUITE = {"eager-n8-ttft_ms": 2.0, "eager-n8-tpot_ms": 1.3, "eager-n8-e2e_ms": 10.0}  # base medians, ms


def noisy_rounds(median_ms: float, seed: int, spread: float = 0.02, n: int = 20) -> list[float]:
    """n round times (ms) around `median_ms`: median_ms x exp(Normal(0, spread))."""
    return list(median_ms * np.exp(np.random.default_rng(seed).normal(0.0, spread, n)))


def entry(case: str, rounds_ms: list[float], model="tiny-random", dtype="fp32", engine="eager", raw=True) -> dict:
    data = [r / 1e3 for r in rounds_ms]
    stats = {"min": min(data), "max": max(data), "mean": statistics.mean(data), "median": statistics.median(data),
             "rounds": len(data), "iterations": 1}
    if raw:
        stats["data"] = data
    return {
        "group": None, "name": f"test_decode[{case}]", "fullname": f"perf_tests/test_x.py::test_decode[{case}]",
        "params": {"case": case}, "param": case, "options": {"disable_gc": True},
        "extra_info": {"metric": case.rsplit("-", 1)[1], "fingerprint": {"model": model, "dtype": dtype, "engine": engine}},
        "stats": stats,
    }


def run_dict(entries: list[dict], **machine) -> dict:
    return {"machine_info": {"node": "test", "inferlab": {**MACHINE, **machine}}, "commit_info": {"id": "abc"},
            "benchmarks": entries, "datetime": "2026-01-01T00:00:00", "version": "5.3.1"}


def write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def suite_file(path, seed: int, factor: float = 1.0, spread: float = 0.02, n: int = 20, suite=SUITE) -> str:
    """A run of `suite` with every round time multiplied by `factor`."""
    entries = [entry(case, [factor * r for r in noisy_rounds(m, seed + i, spread, n)])
               for i, (case, m) in enumerate(suite.items())]
    return write(path, run_dict(entries))


def compare_files(base, head, **kwargs) -> gate.Report:
    base_runs = [gate.load_run(p) for p in ([base] if isinstance(base, str) else base)]
    head_runs = [gate.load_run(p) for p in ([head] if isinstance(head, str) else head)]
    gate.check_comparable(base_runs, head_runs)
    return gate.compare(base_runs, head_runs, thresholds=gate.parse_thresholds("5%"), **kwargs)


# ----------------------------------------------------------------------------- verdicts


def test_identical_runs_pass_with_ratio_exactly_one(tmp_path):
    path = suite_file(tmp_path / "a.json", seed=1)
    report = compare_files(path, path)
    assert [row.ratio for row in report.rows] == [1.0, 1.0, 1.0]
    assert all(row.ci_low < 1 < row.ci_high for row in report.rows)
    assert report.verdict == gate.PASS and report.exit_code == 0


def test_ten_percent_slower_fails(tmp_path):
    report = compare_files(suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=50, factor=1.10))
    assert all(row.verdict == gate.FAIL for row in report.rows)
    assert all(1.0 < row.ci_low and row.ci_low < row.ratio < row.ci_high for row in report.rows)
    assert all(abs(row.ratio - 1.10) < 0.03 for row in report.rows)  # 2% noise, 20 rounds: median within ~3%
    assert report.exit_code == 1


def test_ten_percent_faster_passes(tmp_path):
    report = compare_files(suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=50, factor=0.90))
    assert all(row.verdict == gate.PASS and row.ci_high < 1 for row in report.rows)
    assert report.exit_code == 0


def test_noisy_but_equal_runs_are_inconclusive_not_fail(tmp_path):
    base = suite_file(tmp_path / "a.json", seed=1, spread=0.3, n=10)
    head = suite_file(tmp_path / "b.json", seed=50, spread=0.3, n=10)
    report = compare_files(base, head)
    assert gate.FAIL not in [row.verdict for row in report.rows]
    assert report.verdict == gate.INCONCLUSIVE and report.exit_code == 3


def test_run_noise_widens_the_interval(tmp_path):
    base, head = suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=50)
    narrow, wide = compare_files(base, head, run_noise=0.0), compare_files(base, head, run_noise=0.05)
    for a, b in zip(narrow.rows, wide.rows):
        assert b.ci_low < a.ci_low and a.ci_high < b.ci_high


def test_bonferroni_widens_the_interval_as_k_grows(tmp_path):
    widths = []
    for k in (1, 4, 16):
        suite = {f"eager-n{i}-tpot_ms": 1.3 for i in range(k)}
        report = compare_files(suite_file(tmp_path / f"a{k}.json", seed=1, suite=suite),
                               suite_file(tmp_path / f"b{k}.json", seed=50, suite=suite))
        first = report.rows[0]  # the same rounds and the same replicates for every k
        assert report.level == pytest.approx(1 - 0.05 / k)
        widths.append(math.log(first.ci_high) - math.log(first.ci_low))
    assert widths[0] < widths[1] < widths[2]


def test_bonferroni_level_and_replicates():
    assert gate.bonferroni_level(0.95, 10) == pytest.approx(0.995)
    assert gate.replicates_for(0.95) == 4000
    assert gate.replicates_for(1 - 0.05 / 12) == 9600  # 20 / (0.05 / 24)


def test_several_runs_per_side_average_log_medians(tmp_path):
    """Constant rounds: the ratio is exp(mean log head medians - mean log base medians) exactly."""
    def const(path, median):  # each file its own session (datetime): separate runs, not one run given twice
        return write(path, {**run_dict([entry("eager-n8-tpot_ms", [median] * 5)]), "datetime": path.name})

    base = [const(tmp_path / "b1.json", 1.0), const(tmp_path / "b2.json", 4.0)]
    head = [const(tmp_path / "h1.json", 2.0), const(tmp_path / "h2.json", 2.0)]
    row = compare_files(base, head).rows[0]
    assert row.ratio == pytest.approx(1.0)  # geometric means: sqrt(1 x 4) = 2 = sqrt(2 x 2)
    assert row.base_median_ms == pytest.approx(2.0) and row.head_median_ms == pytest.approx(2.0)
    assert row.ci_low < 1 < row.ci_high  # resampling base runs sees the 1 ms / 4 ms spread


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (0.97, 1.04, gate.PASS),  # below 1 + t
        (1.01, 1.049, gate.PASS),  # a real slowdown, but certainly smaller than t
        (0.90, 0.95, gate.PASS),  # faster
        (1.01, 1.08, gate.FAIL),  # significant, and t is inside the interval
        (1.06, 1.12, gate.FAIL),  # beyond t
        (0.99, 1.08, gate.INCONCLUSIVE),  # cannot tell 0 from t
        (0.99, 1.05, gate.INCONCLUSIVE),  # high = 1 + t is not below it
    ],
)
def test_verdict_rule(low, high, expected):
    assert gate.verdict(low, high, 0.05) == expected


def test_suite_verdict_is_the_worst_row():
    assert gate.suite_verdict([gate.PASS, gate.INCONCLUSIVE, gate.FAIL]) == gate.FAIL
    assert gate.suite_verdict([gate.PASS, gate.INCONCLUSIVE]) == gate.INCONCLUSIVE
    assert gate.suite_verdict([gate.PASS, gate.PASS]) == gate.PASS


def test_pytest_benchmark_style_compares_single_medians(tmp_path):
    base = gate.load_run(write(tmp_path / "a.json", run_dict([entry("eager-n8-tpot_ms", [1.0, 2.0, 3.0]),
                                                                entry("eager-n8-e2e_ms", [10.0] * 3)])))
    head = gate.load_run(write(tmp_path / "b.json", run_dict([entry("eager-n8-tpot_ms", [1.0, 2.12, 9.0]),
                                                                entry("eager-n8-e2e_ms", [10.4] * 3)])))
    fails = gate.pytest_benchmark_style(base, head, 0.05)
    assert fails == {"perf_tests/test_x.py::test_decode[eager-n8-tpot_ms]": True,  # 2.12 > 2 x 1.05
                     "perf_tests/test_x.py::test_decode[eager-n8-e2e_ms]": False}  # 10.4 <= 10.5


def test_estimate_run_noise_is_the_std_of_log_medians(tmp_path):
    runs = [gate.load_run(write(tmp_path / f"{i}.json", run_dict([entry("eager-n8-tpot_ms", [1.3 * math.exp(s)] * 5)])))
            for i, s in enumerate((-0.02, 0.0, 0.02))]
    noise = gate.estimate_run_noise(runs)
    assert noise == {"perf_tests/test_x.py::test_decode[eager-n8-tpot_ms]": pytest.approx(0.02, abs=1e-12)}
    with pytest.raises(UsageError, match="at least 2 runs"):
        gate.estimate_run_noise(runs[:1])


@pytest.mark.parametrize("df, factor", [(1, 15.95), (4, 2.37), (7, 1.80), (19, 1.370)])
def test_the_noise_bound_is_the_chi_square_upper_confidence_bound(df, factor):
    # sqrt(df / chi2_0.05(df)), from the tables: chi2_0.05 = 0.00393, 0.711, 2.167, 10.117
    assert gate.noise_upper_bound(0.01, df) == pytest.approx(0.01 * factor, rel=5e-3)
    assert gate.noise_upper_bound(0.01, df, confidence=0.5) < gate.noise_upper_bound(0.01, df)
    with pytest.raises(UsageError, match="at least 1 degree of freedom"):
        gate.noise_upper_bound(0.01, 0)


def test_calibrated_noise_is_the_bound_over_runs_minus_one_degrees_of_freedom(tmp_path):
    runs = [gate.load_run(write(tmp_path / f"{i}.json", run_dict([entry("eager-n8-tpot_ms", [1.3 * math.exp(s)] * 5)])))
            for i, s in enumerate((-0.02, 0.0, 0.02))]
    [(name, bound)] = gate.calibrated_run_noise(runs).items()
    assert bound == pytest.approx(gate.noise_upper_bound(0.02, 2)) and bound > 0.02 * 4  # 3 runs: x4.4


# ----------------------------------------------------------------------------- thresholds


@pytest.mark.parametrize(
    "text, expected",
    [
        ("5%", {"default": 0.05}),
        ("2.5 %", {"default": 0.025}),
        ("0%", {"default": 0.0}),
        ("tpot_ms=3%,default=5%", {"tpot_ms": 0.03, "default": 0.05}),
        ("tpot_ms=3%", {"tpot_ms": 0.03, "default": 0.05}),
        (" ttft_ms = 10% , e2e_ms=8% ", {"ttft_ms": 0.10, "e2e_ms": 0.08, "default": 0.05}),
    ],
)
def test_parse_thresholds(text, expected):
    assert gate.parse_thresholds(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("5", "'5' is not a percentage"),
        ("0.05", "is not a percentage"),
        ("fast", "is not a percentage"),
        ("-5%", "outside [0%, 100%)"),
        ("100%", "outside [0%, 100%)"),
        ("tpot_ms=3%,tpot_ms=4%", "sets tpot_ms twice"),
        ("", "empty entry"),
        ("5%,", "empty entry"),
        ("tpot ms=3%", "not a metric name"),
    ],
)
def test_bad_thresholds_say_how_to_write_one(text, fragment):
    with pytest.raises(UsageError, match="threshold") as error:
        gate.parse_thresholds(text)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_per_metric_threshold_applies_to_its_rows_only(tmp_path):
    path = suite_file(tmp_path / "a.json", seed=1)
    runs = [gate.load_run(path)]
    report = gate.compare(runs, runs, thresholds=gate.parse_thresholds("tpot_ms=3%,default=7%"))
    assert {row.metric: row.threshold for row in report.rows} == {"ttft_ms": 0.07, "tpot_ms": 0.03, "e2e_ms": 0.07}


def test_a_threshold_for_a_metric_no_benchmark_measures_is_an_error(tmp_path):
    runs = [gate.load_run(suite_file(tmp_path / "a.json", seed=1))]
    with pytest.raises(UsageError, match="--threshold names tpot, which no benchmark measures"):
        gate.compare(runs, runs, thresholds=gate.parse_thresholds("tpot=3%"))


# ----------------------------------------------------------------------------- bad input


def good_entries() -> list[dict]:
    return [entry(case, noisy_rounds(m, i)) for i, (case, m) in enumerate(SUITE.items())]


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "no such file"),
        ("", "is empty"),
        ("  \n", "is empty"),
        ("{not json", "is not valid JSON (line 1"),
        (b"\xff\xfe\x00", "is not valid JSON"),
        (json.dumps({"hello": 1}), "is not a pytest-benchmark run"),
        (json.dumps([1, 2]), "is not a pytest-benchmark run"),
        (json.dumps({"machine_info": {}, "benchmarks": [{"name": "x"}]}), "is not a pytest-benchmark run"),
        (json.dumps(run_dict([])), "holds no benchmarks"),
        (json.dumps(run_dict([entry("eager-n8-tpot_ms", [1.0, 1.1], raw=False)])),
         "saved without raw data: re-run with --benchmark-save-data"),
        (json.dumps(run_dict([entry("eager-n8-tpot_ms", [1.0, 0.0])])), "not positive numbers"),
        (json.dumps(run_dict([entry("eager-n8-tpot_ms", [1.0]), entry("eager-n8-tpot_ms", [1.0])])), "more than once"),
    ],
)
def test_unusable_files_are_one_line_errors_naming_the_file(tmp_path, content, fragment):
    path = tmp_path / "run.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as error:
        gate.load_run(path)
    message = str(error.value)
    assert fragment in message and str(path) in message and "\n" not in message


def test_a_folder_is_not_a_run(tmp_path):
    with pytest.raises(UsageError, match="is a folder: pass one run's JSON file"):
        gate.load_run(tmp_path)


def test_benchmarks_on_one_side_only_are_named(tmp_path):
    base = gate.load_run(write(tmp_path / "a.json", run_dict(good_entries())))
    extra = [entry(f"hf-n{i}-tpot_ms", [1.0, 1.1]) for i in range(5)]
    head = gate.load_run(write(tmp_path / "b.json", run_dict(good_entries()[1:] + extra)))
    with pytest.raises(UsageError) as error:
        gate.check_comparable([base], [head])
    message = str(error.value)
    assert "1 only in" in message and "eager-n8-ttft_ms" in message
    assert "5 only in" in message and "hf-n0-tpot_ms" in message and "and 2 more" in message
    assert "run the same tests" in message and "\n" not in message


@pytest.mark.parametrize("key, value", [("device_name", "Other CPU"), ("device_count", 2), ("model", "smollm2-135m"),
                                        ("dtype", "bf16"), ("layout", "tp2")])
def test_runs_from_another_machine_model_or_dtype_are_refused(tmp_path, key, value):
    base = gate.load_run(write(tmp_path / "a.json", run_dict(good_entries())))
    head = gate.load_run(write(tmp_path / "b.json", run_dict(good_entries(), **{key: value})))
    with pytest.raises(UsageError, match=f"differ in {key} .*compare runs made on the same device"):
        gate.check_comparable([base], [head])


@pytest.mark.parametrize("key, value", [("model", "smollm2-135m"), ("dtype", "bf16"), ("engine", "hf")])
def test_benchmarks_of_another_model_dtype_or_engine_are_refused(tmp_path, key, value):
    base = gate.load_run(write(tmp_path / "a.json", run_dict(good_entries())))
    changed = good_entries()
    changed[1]["extra_info"]["fingerprint"][key] = value
    head = gate.load_run(write(tmp_path / "b.json", run_dict(changed)))
    with pytest.raises(UsageError, match=f"eager-n8-tpot_ms\\]: {key} is .* but '{value}'"):
        gate.check_comparable([base], [head])


def test_base_runs_must_agree_among_themselves_too(tmp_path):
    a = gate.load_run(write(tmp_path / "a.json", run_dict(good_entries())))
    b = gate.load_run(write(tmp_path / "b.json", run_dict(good_entries(), dtype="bf16")))
    with pytest.raises(UsageError, match="differ in dtype"):
        gate.compare([a, b], [a])


def test_loading_and_comparing_never_modify_the_input_files(tmp_path, capsys):
    paths = [suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=2)]
    before = [(open(p, "rb").read(), os.stat(p).st_mtime_ns) for p in paths]
    report = compare_files(*paths)
    gate.write_report_json(report, tmp_path / "report.json")
    main(["gate", *paths])
    assert [(open(p, "rb").read(), os.stat(p).st_mtime_ns) for p in paths] == before
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "report.json"]


# ----------------------------------------------------------------------------- output


def test_table_has_a_row_per_benchmark_a_summary_and_the_settings(tmp_path):
    report = compare_files(suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=50, factor=1.1))
    lines = gate.format_table(report).splitlines()
    assert len(lines) == 2 + 3 + 2
    row = next(line for line in lines if "eager-n8-tpot_ms" in line)
    assert "tpot_ms" in row and "5%" in row and row.endswith("FAIL")
    assert f"{report.rows[1].base_median_ms:.3f}" in row  # milliseconds, not seconds
    assert lines[-2] == "gate: FAIL (3 FAIL, 0 INCONCLUSIVE, 0 PASS of 3 benchmarks)"
    assert "k = 3" in lines[-1] and "98.33%" in lines[-1] and "run_noise 1%" in lines[-1]


def test_report_json_holds_every_row_and_the_settings(tmp_path):
    report = compare_files(suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=2))
    saved = json.loads(gate.write_report_json(report, tmp_path / "r.json").read_text())
    assert saved["schema"] == "inferlab.gate/1" and saved["verdict"] == report.verdict
    assert saved["settings"]["k"] == 3 and saved["settings"]["run_noise"] == 0.01
    assert saved["settings"]["thresholds"] == {"default": 0.05}
    assert [r["verdict"] for r in saved["rows"]] == [r.verdict for r in report.rows]
    assert saved["rows"][0]["base_rounds_ms"] == [list(report.rows[0].base_rounds_ms[0])]


def test_report_json_never_overwrites(tmp_path):
    report = compare_files(suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=2))
    (tmp_path / "r.json").write_text("keep")
    with pytest.raises(UsageError, match="exists and is kept"):
        gate.write_report_json(report, tmp_path / "r.json")
    assert (tmp_path / "r.json").read_text() == "keep"
    with pytest.raises(UsageError, match="does not exist"):
        gate.write_report_json(report, tmp_path / "no" / "r.json")


# ----------------------------------------------------------------------------- the command line


def test_cli_exit_codes_pass_fail_inconclusive(tmp_path, capsys):
    base = suite_file(tmp_path / "a.json", seed=1)
    assert main(["gate", base, suite_file(tmp_path / "same.json", seed=1)]) == 0
    assert main(["gate", base, suite_file(tmp_path / "slow.json", seed=50, factor=1.10)]) == 1
    noisy = suite_file(tmp_path / "n1.json", seed=1, spread=0.3, n=10)
    assert main(["gate", noisy, suite_file(tmp_path / "n2.json", seed=50, spread=0.3, n=10)]) == 3
    out = capsys.readouterr().out
    assert "gate: PASS" in out and "gate: FAIL" in out and "gate: INCONCLUSIVE" in out


def test_cli_repeats_and_json(tmp_path, capsys):
    base = [suite_file(tmp_path / f"a{i}.json", seed=10 * i) for i in range(3)]
    head = [suite_file(tmp_path / f"b{i}.json", seed=100 + 10 * i, factor=1.10) for i in range(3)]
    code = main(["gate", base[0], head[0], "--base-runs", *base[1:], "--head-runs", *head[1:],
                 "--threshold", "tpot_ms=3%,default=5%", "--json", str(tmp_path / "r.json")])
    assert code == 1
    saved = json.loads((tmp_path / "r.json").read_text())
    assert len(saved["base_runs"]) == 3 and len(saved["rows"][0]["head_rounds_ms"]) == 3
    assert "3 base and 3 head run(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["gate", "MISSING", "A"], "MISSING: no such file"),
        (["gate", "A", "A", "--threshold", "5"], "'5' is not a percentage"),
        (["gate", "A", "A", "--json", "A"], "exists and is kept"),
        (["gate", "A", "NORAW"], "saved without raw data"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, fragment):
    files = {"A": suite_file(tmp_path / "a.json", seed=1), "MISSING": str(tmp_path / "missing.json"),
             "NORAW": write(tmp_path / "noraw.json", run_dict([entry(c, [m, m], raw=False) for c, m in SUITE.items()]))}
    code = main([files.get(arg, arg) for arg in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("inferlab: error: ") and fragment.replace("MISSING", files["MISSING"]) in err


# ----------------------------------------------------------------------------- a real run


PLUGIN_TEST = """
import pytest
from inferlab.pytest_plugin import PerfCase

@pytest.mark.parametrize("metric", ["ttft_ms", "tpot_ms"])
def test_tiny(decode_benchmark, metric):
    decode_benchmark(PerfCase("eager", 4, 4, metric), model="tiny-random", rounds=3, warmup=0)
"""


PLUGIN_CONFTEST = """
import importlib.metadata
_ENTRY_POINTS = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
pytest_plugins = [] if "inferlab.pytest_plugin" in _ENTRY_POINTS else ["inferlab.pytest_plugin"]
"""


def test_runs_saved_by_the_plugin_load_and_compare(pytester):
    pytester.makeconftest(PLUGIN_CONFTEST)  # the plugin once, whether installed (entry point) or not
    pytester.makepyfile(test_tiny=PLUGIN_TEST)
    paths = []
    for name in ("base.json", "head.json"):
        result = pytester.runpytest("-p", "no:cacheprovider", "--inferlab-device", "cpu",
                                    f"--benchmark-json={name}", "--benchmark-save-data")
        result.assert_outcomes(passed=2)
        paths.append(pytester.path / name)
    runs = [gate.load_run(p) for p in paths]
    gate.check_comparable(runs[:1], runs[1:])
    assert runs[0].machine["device_type"] == "cpu" and runs[0].machine["dtype"] == "fp32"
    assert sorted(s.metric for s in runs[0].series) == ["tpot_ms", "ttft_ms"]
    assert all(len(s.rounds_s) == 3 and s.fingerprint["engine"] == "eager" for s in runs[0].series)
    report = gate.compare(runs[:1], runs[1:])
    assert report.k == 2 and [row.metric for row in report.rows] == [s.metric for s in runs[0].series]
    for row in report.rows:  # one run per side: the estimate is exactly the ratio of the two medians
        base, head = runs[0].get(row.fullname), runs[1].get(row.fullname)
        assert row.ratio == pytest.approx(head.median_ms / base.median_ms, rel=1e-9)
        assert row.ci_low <= row.ratio <= row.ci_high
