"""`inferlab history` on synthetic histories of 30 saved runs with known steps and slips.

Each run's rounds are level x exp(run shift) x exp(round noise): run shift Normal(0, 0.3%),
20 rounds with 1% noise (a run median's own noise ~0.3%), from seeded generators.
"""

import json
import math

import pytest

pytest.importorskip("ruptures", reason="inferlab history needs ruptures (installed with inferlab)")

from inferlab.cli import main  # noqa: E402
from inferlab.errors import UsageError  # noqa: E402
from inferlab.suite import gate, history  # noqa: E402
from inferlab.suite.gate import simulate  # noqa: E402
from test_gate import write  # noqa: E402

CASE = "eager-b1-p16-n32-tpot_ms"


def levels_with_step(n=30, at=15, step=0.03) -> list[float]:
    return [1.0 if i < at else 1.0 + step for i in range(n)]


def levels_with_slips(n=30, first=10, slips=10, slip=0.005) -> list[float]:
    """Flat, then `slips` consecutive runs each 0.5% slower than the one before, then flat."""
    return [(1 + slip) ** min(max(i - first + 1, 0), slips) for i in range(n)]


def save_history(folder, levels, seed=0, node="runner-1", device="Test CPU", median_ms=1.3) -> list[str]:
    """One saved run per level, in pytest-benchmark's .benchmarks layout, with datetime and commit."""
    folder.mkdir(parents=True, exist_ok=True)
    runs = simulate.synthetic_history(levels, seed, CASE, median_ms, node=node, device_name=device)
    return [write(folder / f"{i + 1:04d}_c{i:03d}.json", run) for i, run in enumerate(runs)]


def one_trail(paths):
    runs, skipped = history.load_runs([__import__("pathlib").Path(p) for p in paths])
    trail, = history.trails(runs)
    return trail


def test_a_three_percent_step_is_found_at_its_run(tmp_path):
    paths = save_history(tmp_path / "m", levels_with_step())
    report = history.analyse(one_trail(paths), budget=0.05)
    change, = report.changes
    assert change.index == 15 and change.commit == "c015" and change.step == pytest.approx(0.03, abs=0.01)
    assert report.drift.change == pytest.approx(0.03, abs=0.01) and not report.drift.over_budget


def test_ten_half_percent_slips_trip_the_drift_budget_though_each_passes_the_gate(tmp_path):
    paths = save_history(tmp_path / "m", levels_with_slips(), seed=1)
    report = history.analyse(one_trail(paths), budget=0.04)
    assert report.drift.change == pytest.approx(1.005**10 - 1, abs=0.01) and report.drift.over_budget
    runs = [gate.load_run(p) for p in paths]
    pairs = [gate.compare([a], [b], thresholds={"default": 0.05}).verdict for a, b in zip(runs, runs[1:])]
    assert pairs == [gate.PASS] * 29  # each step passes a 5% gate; their sum is caught above
    # the gate enforces the same budget against a pinned reference
    assert main(["gate", paths[-2], paths[-1], "--reference", paths[0], "--drift-budget", "4%", "--tails", "none"]) == 1
    assert main(["gate", paths[-2], paths[-1], "--tails", "none"]) == 0


def test_a_flat_history_has_no_change_point_and_no_drift(tmp_path):
    report = history.analyse(one_trail(save_history(tmp_path / "m", [1.0] * 30, seed=2)), budget=0.02)
    assert report.changes == () and abs(report.drift.change) < 0.01 and abs(report.trend) < 0.001


def test_trend_and_robust_sigma_on_exact_series():
    y = [math.log(1.01) * i for i in range(10)]
    assert history.trend_per_run(y) == pytest.approx(0.01)
    assert history.robust_sigma([0.0] * 10) == 0.0
    assert history.change_indices([0.0] * 3 + [0.1] * 3) == [3]  # a constant series: any step is found


def test_machines_stay_apart_and_order_can_follow_commits(tmp_path):
    a = save_history(tmp_path / "a", levels_with_step(n=12, at=6), node="runner-1")
    b = save_history(tmp_path / "b", [1.0] * 8, node="runner-2", seed=5, median_ms=2.6)
    runs, _ = history.load_runs(history.run_files([tmp_path]))
    trails = history.trails(runs)
    assert sorted(len(t.points) for t in trails) == [8, 12] and len({t.machine for t in trails}) == 2
    # commit order: reverse the commit times of machine a; its points reverse too
    for i, path in enumerate(a):
        data = json.loads(open(path).read())
        data["commit_info"]["time"] = f"2026-10-{30 - i:02d}T00:00:00"
        open(path, "w").write(json.dumps(data))
    runs, _ = history.load_runs(history.run_files([tmp_path]))
    by_commit = next(t for t in history.trails(runs, "commit") if "runner-1" in t.machine)
    assert [p.commit for p in by_commit.points] == [f"c{i:03d}" for i in reversed(range(12))]
    assert b  # machine b is read but not mixed in


def test_cli_prints_plots_and_exits_1_over_budget(tmp_path, capsys):
    paths = save_history(tmp_path / ".benchmarks" / "Linux", levels_with_slips(), seed=1)
    (tmp_path / ".benchmarks" / "gate.json").write_text('{"schema": "inferlab.gate/2"}')  # not a run: skipped
    assert main(["history", str(tmp_path / ".benchmarks"), "--drift-budget", "4%", "--out", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    assert "OVER 4%" in out and "skipped 1 file(s)" in out
    folder, = (tmp_path / "out").iterdir()
    pngs = list(folder.glob("*.png"))
    assert len(pngs) == 1 and pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((folder / "history.json").read_text())
    assert saved["trails"][0]["drift"]["over_budget"] is True and len(saved["trails"][0]["runs"]) == 30
    # pinned to a run after the slips: within budget
    assert main(["history", str(tmp_path / ".benchmarks"), "--reference", paths[20], "--drift-budget", "4%"]) == 0


@pytest.mark.parametrize("argv, fragment", [
    (["history", "NOWHERE"], "no such file or folder"),
    (["history", "DIR", "--drift-budget", "five"], "give one percentage"),
    (["history", "DIR", "--reference", "OTHER"], "not among the runs read"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, argv, fragment):
    save_history(tmp_path / "d", [1.0] * 4)
    other = save_history(tmp_path / "o", [1.0])[0]
    names = {"NOWHERE": str(tmp_path / "nowhere"), "DIR": str(tmp_path / "d"), "OTHER": other}
    assert main([names.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fragment in err


def test_no_runs_is_an_error(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(UsageError, match="none of the 1 file"):
        history.load_runs(history.run_files([tmp_path]))
