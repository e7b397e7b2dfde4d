"""`inferlab ab`: the sequential paired statistics, the ABBA loop with an injected runner, and the CLI
with fake suite commands (tiny python scripts writing runs whose timings differ by a known factor).
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferlab.cli import main
from inferlab.errors import UsageError
from inferlab.suite import ab, gate
from inferlab.suite.gate import sequential
from test_gate import suite_file

# ----------------------------------------------------------------------------- statistics


def test_paired_interval_is_the_student_t_interval():
    d = np.array([0.0, 0.2])  # mean 0.1, sd 0.1414, t(0.975, 1) = 12.706
    ratio, low, high = sequential.paired_interval(d, 0.95)
    half = 12.706204736 * math.sqrt(0.02) / math.sqrt(2)
    assert ratio == pytest.approx(math.exp(0.1)) and low == pytest.approx(math.exp(0.1 - half)) and high == pytest.approx(math.exp(0.1 + half))
    with pytest.raises(ValueError, match="at least 2 pairs"):
        sequential.paired_interval(np.array([0.1]), 0.95)


def test_look_level_spends_alpha_over_benchmarks_and_looks():
    assert sequential.look_level(0.95, 3, 10) == pytest.approx(1 - 0.05 / 30)


def test_minimum_detectable_effect_shrinks_with_pairs():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 0.05, 40)
    assert sequential.minimum_detectable_effect(d[:20], 0.99) < sequential.minimum_detectable_effect(d[:5], 0.99)


def peeking_false_alarms(level_of, sequences=400, max_pairs=12, min_pairs=3, noise=0.1) -> float:
    """Fraction of A/A sequences (no true change) that FAIL at some look when stopping at the first decision."""
    rng = np.random.default_rng(1)
    alarms = 0
    for _ in range(sequences):
        d = rng.normal(0.0, noise, max_pairs)
        for n in range(min_pairs, max_pairs + 1):
            _, low, high = sequential.paired_interval(d[:n], level_of(max_pairs - min_pairs + 1))
            decided = gate.verdict(low, high, 0.05)
            if decided != gate.INCONCLUSIVE:
                alarms += decided == gate.FAIL
                break
    return alarms / sequences


def test_alpha_spending_keeps_false_alarms_under_peeking_and_naive_looks_do_not():
    spent = peeking_false_alarms(lambda looks: sequential.look_level(0.95, 1, looks))
    naive = peeking_false_alarms(lambda looks: 0.95)
    assert spent <= 0.025  # one-sided share of the 5% family-wise bound
    assert naive > 2 * max(spent, 0.01)  # the same data, peeked at without spending: more false alarms


# ----------------------------------------------------------------------------- the loop, with an injected runner


class FakeSuite:
    """Writes a run of test_gate's SUITE; head is `factor` times base, each run shifted by exp(N(0, noise))."""

    def __init__(self, tmp_path, factor: float, noise: float = 0.02, interrupt_at: int | None = None):
        self.tmp_path, self.factor, self.noise, self.interrupt_at = tmp_path, factor, noise, interrupt_at
        self.calls: list[str] = []
        self.rng = np.random.default_rng(7)

    def __call__(self, side, path):
        self.calls.append(side)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            path.write_text("{ half a run")  # an interrupted run leaves a partial file behind
            raise KeyboardInterrupt
        shift = math.exp(self.rng.normal(0.0, self.noise)) * (self.factor if side == "head" else 1.0)
        source = suite_file(self.tmp_path / f"src-{len(self.calls)}.json", seed=len(self.calls), factor=shift)
        path.write_text(open(source).read())


def plan(**kwargs):
    return ab.Plan(gate.parse_thresholds("5%"), **kwargs)


def test_a_ten_percent_slowdown_fails_early_in_abba_order(tmp_path):
    suite = FakeSuite(tmp_path, 1.10)
    (tmp_path / "runs").mkdir()
    outcome = ab.run_ab(suite, plan(max_pairs=20), tmp_path / "runs")
    assert outcome.stopped_by == "decision" and outcome.last.verdict == gate.FAIL
    assert outcome.pairs < 20 and len(outcome.looks) == outcome.pairs - 2
    assert suite.calls[:6] == ["base", "head", "head", "base", "base", "head"]
    assert suite.calls == [side for pair in range(outcome.pairs) for side in ab.order(pair)]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(
        [f"base-{i:03d}.json" for i in range(1, outcome.pairs + 1)] + [f"head-{i:03d}.json" for i in range(1, outcome.pairs + 1)])
    assert all(row.ratio == pytest.approx(1.10, abs=0.04) for row in outcome.last.rows)


def test_unchanged_code_passes_or_runs_out_of_pairs_but_does_not_fail(tmp_path):
    (tmp_path / "runs").mkdir()
    outcome = ab.run_ab(FakeSuite(tmp_path, 1.0), plan(max_pairs=8), tmp_path / "runs")
    assert outcome.last.verdict in (gate.PASS, gate.INCONCLUSIVE)
    assert outcome.stopped_by == ("decision" if outcome.last.verdict == gate.PASS else "max pairs")
    noise = ab.measured_noise(outcome)
    assert set(noise) == set(gate.load_run(outcome.base_paths[0]).names)
    assert all(0.005 < v < 0.05 for v in noise.values())  # runs shifted by 2%: sd(d)/sqrt(2) ~ 2%


def test_an_interrupt_keeps_every_finished_run_and_no_partial_one(tmp_path):
    (tmp_path / "runs").mkdir()
    outcome = ab.run_ab(FakeSuite(tmp_path, 1.0, interrupt_at=4), plan(), tmp_path / "runs")
    assert outcome.stopped_by == "interrupted" and outcome.pairs == 1 and outcome.looks == []
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["base-001.json", "head-001.json", "head-002.json"]
    assert all(gate.load_run(p) for p in (tmp_path / "runs").iterdir())


def test_minutes_budget_stops_before_a_pair_that_would_overrun(tmp_path):
    ticks = iter(range(0, 10_000, 100))  # every clock read moves 100 s on
    (tmp_path / "runs").mkdir()
    outcome = ab.run_ab(FakeSuite(tmp_path, 1.0, noise=0.3), plan(max_minutes=10), tmp_path / "runs", clock=lambda: next(ticks))
    assert outcome.stopped_by == "max minutes" and outcome.pairs < 20


def test_plan_refuses_impossible_budgets():
    for kwargs, fragment in (({"min_pairs": 1}, "at least 2"), ({"min_pairs": 5, "max_pairs": 4}, "at least --min-pairs"),
                             ({"max_minutes": 0}, "positive")):
        with pytest.raises(UsageError, match=fragment):
            plan(**kwargs)


# ----------------------------------------------------------------------------- the command line, with fake suite commands


FAKE_SUITE = '''
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_gate import SUITE, entry, run_dict
factor = float(open("factor.txt").read()) if len(sys.argv) < 3 else float(sys.argv[2])
rng = np.random.default_rng()
shift = factor * float(np.exp(rng.normal(0, 0.01)))
entries = [entry(case, list(m * shift * np.exp(rng.normal(0, 0.02, 20)))) for case, m in SUITE.items()]
run = run_dict(entries)
run["machine_info"]["node"] = "fake-node"
open(sys.argv[1], "w").write(json.dumps(run))
'''


def fake_script(folder):
    script = folder / "suite.py"
    script.write_text(FAKE_SUITE.format(tests=str(Path(__file__).parent)))
    return script


def test_cli_two_commands_fail_a_slower_head_and_calibrate_the_noise(tmp_path, capsys):
    script = fake_script(tmp_path)
    store = tmp_path / "store"
    argv = ["ab", "--base-cmd", f"{sys.executable} {script} {{out}} 1.0", "--head-cmd", f"{sys.executable} {script} {{out}} 1.5",
            "--out", str(tmp_path / "out"), "--noise-store", str(store), "--max-pairs", "6"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "ab: FAIL after 3 pair(s)" in out and "run noise saved to" in out
    folder, = (tmp_path / "out").iterdir()
    saved = json.loads((folder / "ab.json").read_text())
    assert saved["verdict"] == "FAIL" and saved["pairs"] == 3 and len(saved["head_runs"]) == 3
    record, = store.rglob("*.json")
    kept = json.loads(record.read_text())
    assert set(kept["run_noise"]) == set(gate.load_run(saved["base_runs"][0]).names)
    # the gate is given the 95% upper bound of the spread over 3 pairs (2 degrees of freedom), the estimate is kept beside it
    assert kept["confidence"] == 0.95 and set(kept["run_noise_estimate"]) == set(kept["run_noise"])
    for name, bound in kept["run_noise"].items():
        assert bound == pytest.approx(gate.noise_upper_bound(kept["run_noise_estimate"][name], 2))
    # a later single-run gate on this machine uses it
    assert main(["gate", saved["base_runs"][0], saved["head_runs"][0], "--run-noise", "calibrated",
                 "--noise-store", str(store)]) == 1


def two_commit_repo(repo, suite_file: str, suite: str):
    """A git repository at `repo` holding `suite` as `suite_file`: base commits factor.txt = 1.0, head 2.0."""
    repo.mkdir()
    (repo / suite_file).write_text(suite)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for factor in ("1.0", "2.0"):
        (repo / "factor.txt").write_text(factor)
        subprocess.run([*git, "add", "."], check=True)
        subprocess.run([*git, "commit", "-qm", f"factor {factor}"], check=True)
    return repo


def test_cli_revisions_run_each_side_from_its_own_worktree(tmp_path, capsys):
    repo = two_commit_repo(tmp_path / "repo", "suite.py", FAKE_SUITE.format(tests=str(Path(__file__).parent)))
    code = main(["ab", "HEAD~1", "HEAD", "--repo", str(repo), "--suite", f"{sys.executable} suite.py {{out}}",
                 "--out", str(tmp_path / "out"), "--noise-store", str(tmp_path / "store"), "--max-pairs", "5"])
    assert code == 1
    trees = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(trees.splitlines()) == 1  # the side worktrees are gone, the runs stay
    folder, = (tmp_path / "out").iterdir()
    assert len(list(folder.glob("head-*.json"))) == 3 and len(list(folder.glob("head-*.log"))) == 3


@pytest.mark.timing
def test_cli_fork_runs_a_pytest_suite_in_forked_children_from_each_worktree(tmp_path, capsys):
    repo = two_commit_repo(tmp_path / "repo", "test_fake.py", (
        "import time\n"
        "def test_step(benchmark):\n"
        "    factor = float(open('factor.txt').read())\n"
        "    benchmark.pedantic(lambda: time.sleep(0.004 * factor), rounds=10, iterations=1)\n"))
    code = main(["ab", "HEAD~1", "HEAD", "--repo", str(repo), "--fork", "--suite",
                 f"{sys.executable} -m pytest test_fake.py -q -p no:cacheprovider", "--out", str(tmp_path / "out"),
                 "--noise-store", str(tmp_path / "store"), "--max-pairs", "5"])
    assert code == 1  # head sleeps twice as long: FAIL
    folder, = (tmp_path / "out").iterdir()
    logs = sorted(folder.glob("head-*.log"))
    assert len(list(folder.glob("head-*.json"))) == len(logs) >= 3 and "1 passed" in logs[0].read_text()


def test_the_fork_needs_a_pytest_suite():
    assert ab.pytest_arguments("python3 -m pytest perf_tests -m 'perf and not gpu'") == ["perf_tests", "-m", "perf and not gpu"]
    assert ab.pytest_arguments("pytest -q") == ["-q"]
    with pytest.raises(UsageError, match="must be `python -m pytest"):
        ab.pytest_arguments("make bench")
    with pytest.raises(UsageError, match="leave {out} out"):
        ab.pytest_arguments("pytest --benchmark-json={out}")


@pytest.mark.parametrize("argv, fragment", [
    (["ab"], "needs two revisions"),
    (["ab", "HEAD", "--base-cmd", "x", "--head-cmd", "y"], "not a mix"),
    (["ab", "no-such-rev", "HEAD"], "is not a commit"),
    (["ab", "--base-cmd", "x", "--head-cmd", "y", "--min-pairs", "1"], "at least 2"),
    (["ab", "--base-cmd", "exit 4", "--head-cmd", "exit 4"], "the base suite command failed (exit 4)"),
    (["ab", "--base-cmd", "x", "--head-cmd", "y", "--fork"], "use it with two revisions"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, argv, fragment):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fragment in err
