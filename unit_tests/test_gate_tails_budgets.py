"""Tail verdicts, absolute budgets, drift against a reference and calibrated run noise, on hand-built runs.

Runs are written in pytest-benchmark's format with test_gate's helpers; rounds and gaps come from
seeded generators, so every verdict below is deterministic.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from inferlab.cli import main
from inferlab.errors import UsageError
from inferlab.suite import gate
from inferlab.suite.gate import budgets as B
from inferlab.suite.gate.calibration import latest_run_noise, save_run_noise
from inferlab.suite.gate.judge import judge
from inferlab.suite.gate.judge_report import format_judgement, judgement_dict
from inferlab.suite.gate.quantiles import parse_tails, resampled_mean_log_quantile, tail_fraction
from test_gate import entry, noisy_rounds, run_dict, write

CASE = "eager-b1-p16-n101-tpot_ms"


def gaps(seed: int, spike_every: int = 0, spike: float = 2.0, requests: int = 20, per: int = 100) -> list[list[float]]:
    """requests x per inter-token gaps around 1 ms (1% noise); every `spike_every`-th gap x `spike`."""
    values = np.exp(np.random.default_rng(seed).normal(0.0, 0.01, (requests, per)))
    if spike_every:
        values.reshape(-1)[::spike_every] *= spike
    return values.round(6).tolist()


def tpot_run(path, seed: int, factor: float = 1.0, itl=None, floor=None, budgets=(), case=CASE, ttft=False) -> str:
    item = entry(case, [factor * r for r in noisy_rounds(1.0, seed)])
    if itl is not None:
        item["extra_info"]["itl_rounds_ms"] = itl
    if floor is not None:
        item["extra_info"]["roofline"] = {"floor_tpot_ms": floor}
    item["extra_info"]["budgets"] = list(budgets)
    entries = [item]
    if ttft:
        entries.append(entry(case.replace("tpot_ms", "ttft_ms"), noisy_rounds(20.0, seed + 7)))
    return write(path, run_dict(entries))


def runs(*paths):
    return [gate.load_run(p) for p in paths]


# ----------------------------------------------------------------------------- tails


def test_tail_fraction_and_parse_tails():
    assert tail_fraction("p99") == 0.99 and tail_fraction("p99.9") == pytest.approx(0.999)
    assert parse_tails("p95,p99") == ("p95", "p99") and parse_tails("none") == ()
    for bad in ("99", "p50", "p100", "p99,p99"):
        with pytest.raises(UsageError):
            parse_tails(bad)


def test_identical_runs_give_tail_ratios_of_exactly_one(tmp_path):
    path = tpot_run(tmp_path / "a.json", 1, itl=gaps(1))
    j = judge(runs(path), runs(path))
    assert [(r.metric, r.stat) for r in j.tails] == [("tpot_ms", "p99"), ("itl_ms", "p99")]
    assert all(r.ratio == 1.0 and r.ci_low <= 1 <= r.ci_high and r.verdict == gate.PASS for r in j.tails)
    assert j.k == 3 and j.medians.level == pytest.approx(1 - 0.05 / 3)


def test_itl_spikes_fail_the_tail_while_the_median_passes(tmp_path):
    """2% of gaps twice as long: the median TPOT moves ~2%, p99 ITL doubles."""
    base = tpot_run(tmp_path / "a.json", 1, itl=gaps(1))
    head = tpot_run(tmp_path / "b.json", 2, itl=gaps(2, spike_every=50))
    j = judge(runs(base), runs(head))
    median, = j.medians.rows
    itl = next(r for r in j.tails if r.metric == "itl_ms")
    assert median.verdict == gate.PASS
    assert itl.verdict == gate.FAIL and itl.ci_low > 1.5 and itl.ratio == pytest.approx(2.0, rel=0.1)
    assert j.verdict == gate.FAIL and j.exit_code == 1


def test_runs_without_saved_gaps_have_no_itl_tail(tmp_path):
    j = judge(runs(tpot_run(tmp_path / "a.json", 1)), runs(tpot_run(tmp_path / "b.json", 2, itl=gaps(2))))
    assert [r.metric for r in j.tails] == ["tpot_ms"]


def test_chunked_draws_follow_the_requested_quantile(monkeypatch):
    """Drawn in chunks of one replicate or all at once, the draws centre on the run's own p99."""
    from inferlab.suite.gate import quantiles

    run = np.asarray(gaps(3, spike_every=50))
    truth = np.log(np.quantile(run, 0.99))
    whole = resampled_mean_log_quantile([run], 0.99, 400, 0.0, np.random.default_rng(0))
    monkeypatch.setattr(quantiles, "CHUNK_VALUES", run.size)  # one replicate per chunk
    chunked = resampled_mean_log_quantile([run], 0.99, 400, 0.0, np.random.default_rng(0))
    assert abs(np.median(whole) - truth) < 0.05 and abs(np.median(chunked) - truth) < 0.05
    assert np.std(chunked) == pytest.approx(np.std(whole), rel=0.3)  # 400 replicates: their std is known to ~10%


def test_tail_threshold_can_be_set_apart(tmp_path):
    base, head = tpot_run(tmp_path / "a.json", 1, itl=gaps(1)), tpot_run(tmp_path / "b.json", 2, itl=gaps(2))
    j = judge(runs(base), runs(head), thresholds=gate.parse_thresholds("itl_ms.p99=20%,default=5%"))
    assert {r.metric: r.threshold for r in j.tails} == {"tpot_ms": 0.05, "itl_ms": 0.20}
    with pytest.raises(UsageError, match="no benchmark measures"):
        judge(runs(base), runs(head), thresholds=gate.parse_thresholds("ttft_ms.p99=20%"))


# ----------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("text, expected", [
    ("tpot_ms=1.5", B.Budget("tpot_ms", "median", 1.5)),
    ("ttft_ms_p99=30", B.Budget("ttft_ms", "p99", 30.0)),
    ("fast-*:tpot_floor_x=1.5", B.Budget("tpot_ms", "median", 1.5, True, "fast-*")),
    ("itl_ms_p99=2", B.Budget("itl_ms", "p99", 2.0)),
])
def test_parse_budget_option(text, expected):
    assert B.parse_budget_option(text) == expected


@pytest.mark.parametrize("text, fragment", [
    ("tpot_ms", "has no '='"), ("tpot=1", "not a budget key"), ("tpot_ms=fast", "not a number"),
    ("tpot_ms=0", "positive number"), ("tpot_floor_x=0.5", "factor >= 1"), ("tpot_ms_p40=1", "not a tail"),
])
def test_bad_budgets_say_what_to_write(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        B.parse_budget_option(text)


@pytest.mark.parametrize("low, high, limit, expected", [
    (1.0, 1.2, 1.2, gate.PASS), (1.0, 1.2, 1.1, gate.INCONCLUSIVE), (1.3, 1.4, 1.2, gate.FAIL), (1.2, 1.4, 1.2, gate.INCONCLUSIVE),
])
def test_budget_verdict_rule(low, high, limit, expected):
    assert B.budget_verdict(low, high, limit) == expected


def test_budgets_in_ms_and_against_the_roofline_floor(tmp_path):
    """Head median TPOT ~1.0 ms (2% round noise), floor 0.5 ms."""
    path = tpot_run(tmp_path / "a.json", 1, floor=0.5)
    given = [B.parse_budget_option(t) for t in ("tpot_ms=1.2", "tpot_ms=0.8", "tpot_ms=1.0", "tpot_floor_x=2.5", "tpot_floor_x=1.5")]
    j = judge(runs(path), runs(path), budgets=given, tails=())
    assert [r.verdict for r in j.budgets] == [gate.PASS, gate.FAIL, gate.INCONCLUSIVE, gate.PASS, gate.FAIL]
    assert [r.limit_ms for r in j.budgets][3:] == [pytest.approx(1.25), pytest.approx(0.75)]
    assert all(r.ci_low_ms < r.value_ms < r.ci_high_ms for r in j.budgets)
    assert j.k == 1 + 5 and j.verdict == gate.FAIL


def test_budgets_saved_with_the_run_are_judged(tmp_path):
    saved = [{"key": "tpot_ms", "value": 0.8, "source": "marker on test_x"}]
    path = tpot_run(tmp_path / "a.json", 1, budgets=saved)
    row, = judge(runs(path), runs(path), tails=()).budgets
    assert row.budget.source == "marker on test_x" and row.verdict == gate.FAIL


def test_a_budget_matching_nothing_and_a_missing_floor_are_errors(tmp_path):
    path = tpot_run(tmp_path / "a.json", 1)
    with pytest.raises(UsageError, match="matches no benchmark"):
        judge(runs(path), runs(path), budgets=[B.parse_budget_option("fast-*:tpot_ms=1")])
    with pytest.raises(UsageError, match="roofline floor"):
        judge(runs(path), runs(path), budgets=[B.parse_budget_option("tpot_floor_x=2")])


def test_budgets_from_pyproject(tmp_path):
    toml = tmp_path / "pyproject.toml"
    toml.write_text('[tool.inferlab.budgets]\n"fast-*" = { tpot_ms = 1.0, tpot_floor_x = 2 }\n"*" = { ttft_ms_p99 = 50 }\n')
    budgets = B.read_pyproject_budgets(toml)
    assert [(b.pattern, b.text) for b in budgets] == [
        ("fast-*", "tpot_ms median <= 1 ms"), ("fast-*", "tpot_ms median <= 2 x floor"), ("*", "ttft_ms p99 <= 50 ms")]
    assert B.applies(budgets[0], "test_gpu[fast-b1-p128-n128-tpot_ms]", "tpot_ms")
    assert not B.applies(budgets[0], "test_gpu[eager-b1-p128-n128-tpot_ms]", "tpot_ms")
    assert not B.applies(budgets[2], "test_gpu[fast-b1-p128-n128-tpot_ms]", "tpot_ms")
    toml.write_text('[tool.inferlab.budgets]\n"*" = { tpot = 1 }\n')
    with pytest.raises(ValueError, match="not a budget key"):
        B.read_pyproject_budgets(toml)


# ----------------------------------------------------------------------------- drift


def test_drift_budget_fails_a_head_that_slipped_past_it(tmp_path):
    reference = tpot_run(tmp_path / "ref.json", 1)
    base = tpot_run(tmp_path / "base.json", 2, factor=1.08)
    head = tpot_run(tmp_path / "head.json", 3, factor=1.10)  # 2% over base: passes; 10% over the reference
    plain = judge(runs(base), runs(head), tails=())
    j = judge(runs(base), runs(head), tails=(), reference_runs=runs(reference), drift_budget=0.05)
    assert plain.verdict == gate.PASS
    drift, = j.drift
    assert drift.ratio == pytest.approx(1.10, abs=0.03) and drift.verdict == gate.FAIL and j.verdict == gate.FAIL
    with pytest.raises(UsageError, match="needs --reference"):
        judge(runs(base), runs(head), drift_budget=0.05)


# ----------------------------------------------------------------------------- report and command line


def test_report_lists_every_kind_of_row(tmp_path):
    base = tpot_run(tmp_path / "a.json", 1, itl=gaps(1), floor=0.5)
    head = tpot_run(tmp_path / "b.json", 2, itl=gaps(2), floor=0.5)
    j = judge(runs(base), runs(head), budgets=[B.parse_budget_option("tpot_floor_x=3")],
              reference_runs=runs(base), drift_budget=0.05)
    text = format_judgement(j)
    assert "p99" in text and "drift" in text and "tpot_ms median <= 3 x floor" in text
    assert f"of {j.k} verdicts" in text and j.k == 5
    data = judgement_dict(j)
    assert data["schema"] == "inferlab.gate/2" and len(data["tails"]) == 2 and len(data["budgets"]) == 1
    assert len(data["drift"]) == 1 and data["rows"][0]["verdict"] == j.medians.rows[0].verdict


def test_cli_budgets_tails_and_drift(tmp_path, capsys):
    base = tpot_run(tmp_path / "a.json", 1, itl=gaps(1), ttft=True)
    head = tpot_run(tmp_path / "b.json", 2, itl=gaps(2), ttft=True)
    ten = ["--threshold", "10%"]  # 2% round noise, k = 6: intervals reach about +-5%
    assert main(["gate", base, head, *ten, "--budget", "ttft_ms=25", "--budget", "tpot_ms_p99=2"]) == 0
    assert main(["gate", base, head, *ten, "--budget", "ttft_ms=15"]) == 1
    assert main(["gate", base, head, *ten, "--tails", "none", "--reference", base, "--drift-budget", "10%",
                 "--json", str(tmp_path / "g.json")]) == 0
    saved = json.loads((tmp_path / "g.json").read_text())
    assert saved["tails"] == [] and len(saved["drift"]) == 2
    capsys.readouterr()
    assert main(["gate", base, head, "--budget", "tpot_ms=x"]) == 2
    assert "not a number" in capsys.readouterr().err


def test_calibrated_run_noise_is_the_newest_record_for_the_machine(tmp_path, capsys):
    base = tpot_run(tmp_path / "a.json", 1)
    head = tpot_run(tmp_path / "b.json", 2, factor=1.10)
    store = tmp_path / "store"
    run = gate.load_run(head)
    name = run.names[0]
    first = save_run_noise(store, run, {name: 0.001}, {"pairs": 3})
    second = save_run_noise(store, run, {name: 0.30}, {"pairs": 9})
    assert first != second and first.exists() and json.loads(first.read_text())["run_noise"] == {name: 0.001}
    assert latest_run_noise(store, run) == ({name: 0.30}, second)
    # 30% calibrated noise cannot resolve 10%; the default 1% can
    assert main(["gate", base, head, "--run-noise", "calibrated", "--noise-store", str(store), "--tails", "none"]) == 3
    assert main(["gate", base, head, "--tails", "none"]) == 1
    assert f"calibrated, from {second}" in capsys.readouterr().out
    other = json.loads(open(head).read())
    other["machine_info"]["inferlab"]["device_name"] = "Other"
    assert main(["gate", base, write(tmp_path / "o.json", other), "--run-noise", "calibrated", "--noise-store", str(store)]) == 2


# ----------------------------------------------------------------------------- a real run through the plugin


PLUGIN_TEST = """
import pytest
from inferlab.pytest_plugin import PerfCase

@pytest.mark.inferlab_budget(tpot_ms=1000.0, tpot_floor_x=1e6)
@pytest.mark.parametrize("metric", ["ttft_ms", "tpot_ms"])
def test_tiny(decode_benchmark, metric):
    decode_benchmark(PerfCase("eager", 4, 5, metric), model="tiny-random", rounds=3, warmup=0)
"""


def test_the_plugin_saves_floor_gaps_and_budgets_and_the_gate_judges_them(pytester, monkeypatch):
    """In a subprocess: an in-process run would leave torch and numpy modules half-imported for later tests."""
    import os
    import pathlib

    from test_gate import PLUGIN_CONFTEST

    root = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(PLUGIN_CONFTEST)
    pytester.makepyfile(test_tiny=PLUGIN_TEST)
    pytester.makefile(".toml", pyproject='[tool.inferlab.budgets]\n"eager-*" = { ttft_ms = 10000 }\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferlab-device", "cpu", "--benchmark-json=run.json",
                                "--benchmark-save-data")
    result.assert_outcomes(passed=2)
    saved = {e["extra_info"]["metric"]: e["extra_info"] for e in json.loads((pytester.path / "run.json").read_text())["benchmarks"]}
    tpot, ttft = saved["tpot_ms"], saved["ttft_ms"]
    assert tpot["roofline"]["floor_tpot_ms"] > 0 and tpot["roofline"]["bandwidth_source"] == "probe"
    assert len(tpot["itl_rounds_ms"]) == 3 and all(len(r) == 4 for r in tpot["itl_rounds_ms"]) and "itl_rounds_ms" not in ttft
    assert sorted(b["key"] for b in tpot["budgets"]) == ["tpot_floor_x", "tpot_ms"]
    assert [(b["key"], b["source"]) for b in ttft["budgets"]] == [("ttft_ms", str(pytester.path / "pyproject.toml"))]
    run = gate.load_run(pytester.path / "run.json")
    j = judge([run], [run])
    assert sorted(r.budget.text for r in j.budgets) == ["tpot_ms median <= 1000 ms", "tpot_ms median <= 1e+06 x floor",
                                                          "ttft_ms median <= 10000 ms"]
    assert all(r.verdict == gate.PASS for r in j.budgets) and {(r.metric, r.stat) for r in j.tails} == {("tpot_ms", "p99"), ("itl_ms", "p99")}


# ----------------------------------------------------------------------------- inferlab calibrate, on runs an H100 made

H100_RUNS = Path(__file__).resolve().parents[1] / "docs" / "perf" / "h100" / "gate-fast" / "runs"


def test_calibrate_saves_each_benchmark_its_own_noise_and_the_gate_then_fails_a_five_percent_tpot(tmp_path, capsys):
    """Eight unchanged fast-engine processes on an H100: TPOT spreads 0.02%, TTFT 1.5%. Saved per
    benchmark, the calibration lets one run per side FAIL the injected 5% on TPOT (median and p99)
    and leaves the unchanged pair without a FAIL (TTFT INCONCLUSIVE: its noise cannot rule out 5%)."""
    store = tmp_path / "store"
    calibration = sorted(str(p) for p in H100_RUNS.glob("cal-*.json") if not p.name.endswith(".meta.json"))
    assert len(calibration) == 8
    assert main(["calibrate", *calibration, "--noise-store", str(store)]) == 0
    out = capsys.readouterr().out
    [record] = list(store.glob("*/*.json"))
    noise = json.loads(record.read_text())["run_noise"]
    tpot = next(v for k, v in noise.items() if k.endswith("tpot_ms]"))
    ttft = next(v for k, v in noise.items() if k.endswith("ttft_ms]"))
    assert tpot < 0.001 < 0.01 < ttft and str(record) in out
    a, a2, h5 = (str(H100_RUNS / f"b00-{label}.json") for label in ("A", "A2", "H5"))
    assert main(["gate", a, h5, "--run-noise", "calibrated", "--noise-store", str(store)]) == 1
    failed = capsys.readouterr().out
    assert "calibrated, from" in failed and "FAIL" in failed
    assert main(["gate", a, a2, "--run-noise", "calibrated", "--noise-store", str(store)]) == 3
    # the largest bound for every entry, as one --run-noise fraction: the TPOT's 5% is no longer resolved
    assert main(["gate", a, h5, "--run-noise", str(max(noise.values()))]) == 3


def test_calibrate_refuses_too_few_or_repeated_runs(tmp_path, capsys):
    one = tpot_run(tmp_path / "a.json", 1)
    assert main(["calibrate", one, "--noise-store", str(tmp_path / "s")]) == 2
    assert "at least 2 runs" in capsys.readouterr().err
    assert main(["calibrate", one, one, "--noise-store", str(tmp_path / "s")]) == 2
    assert "given twice" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
