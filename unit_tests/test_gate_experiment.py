"""perf_tests/scripts/gate_experiment.py's analysis on synthetic saved runs: blocks of three runs
(--injected 5), p99 tail verdicts, the calibrated noise bound, and --combine pooling two experiments."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferlab.suite import gate
from inferlab.suite.gate import simulate

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "gate_experiment.py"
CASES = ("fast-b1-p128-n32-tpot_ms", "fast-b1-p128-n32-ttft_ms")


@pytest.fixture(scope="module")
def experiment(perf_script):
    return perf_script("gate_experiment")


def write_run(path: Path, factor: float, rng, ttft_run_noise: float = 0.0) -> None:
    """TPOT: 0.85 ms x factor, 0.2% round to round; TTFT: 2 ms, 0.5% round to round, shifted per run by ttft_run_noise."""
    rounds = {CASES[0]: list(0.85 * factor * np.exp(rng.normal(0, 0.002, 20))),
              CASES[1]: list(2.0 * np.exp(rng.normal(0, ttft_run_noise) + rng.normal(0, 0.005, 20)))}
    path.write_text(json.dumps(simulate.saved_run(rounds, node="gpu-1", device_name="Test GPU",
                                                  when="2026-12-05T00:00:00", commit="c")))


def make_experiment(folder: Path, experiment, blocks: int, seed: int, ttft_run_noise: float = 0.0) -> None:
    rng = np.random.default_rng(seed)
    runs = folder / "runs"
    runs.mkdir(parents=True)
    for i in range(8):
        write_run(runs / f"cal-{i:02d}.json", 1.0, rng, ttft_run_noise)
    calibration = [gate.load_run(runs / f"cal-{i:02d}.json") for i in range(8)]
    noise = gate.calibrated_run_noise(calibration)
    plan = {"setup": {"device": "cuda", "engines": "fast"}, "threshold": 0.05, "injected": [0.05],
            "delays_ms": {"5%": 0.0425}, "run_noise_per_benchmark": noise, "calibrated_run_noise": max(noise.values())}
    (folder / "plan.json").write_text(json.dumps(plan))
    for index in range(blocks):
        for label in experiment.block_labels(index, (0.05,)):
            write_run(runs / f"b{index:02d}-{label}.json", 1.05 if label == "H5" else 1.0, rng, ttft_run_noise)
    write_run(runs / f"b{blocks:02d}-A.json", 1.0, rng, ttft_run_noise)  # an interrupted block: left out


def test_blocks_of_three_runs_when_only_five_percent_is_injected(experiment):
    assert experiment.block_labels(0, (0.05,)) == ("A", "H5", "A2")
    assert experiment.block_labels(1, (0.05,)) == ("A2", "H5", "A")
    assert experiment.block_labels(1) == ("H10", "A2", "H5", "A")


def test_one_experiment_fails_the_injected_pairs_on_medians_and_p99_tails(experiment, tmp_path):
    make_experiment(tmp_path / "e1", experiment, blocks=4, seed=1)
    loaded = experiment.load_experiment(tmp_path / "e1", quiet_cores=0.2)
    assert len(loaded[2]) == 4  # the interrupted fifth block is not counted
    summary = experiment.analyse([loaded], 0.95)
    calibrated = summary["table"]["gate run_noise=calibrated"]
    assert calibrated["A/A"]["pairs"] == 4 and calibrated["A/A"]["suite_fail"] == 0
    assert calibrated["5%"]["entries_fail"] == 1.0 and calibrated["5% p99"]["entries_fail"] > 0
    assert calibrated["5% TTFT (unaffected)"]["entries_fail"] == 0
    table = experiment.format_table(summary)
    assert "5%: p99 TPOT FAIL" in table and "gate run_noise=calibrated (n=4)" in table


def test_a_noisy_ttft_blinds_the_largest_bound_but_not_the_per_benchmark_bounds(experiment, tmp_path):
    """TTFT spreading 2% from run to run beside a steady TPOT: the largest calibrated bound, applied
    to the TPOT entry too, leaves its 5% slowdown INCONCLUSIVE; each entry's own bound FAILs it,
    with no A/A false alarm."""
    make_experiment(tmp_path / "e1", experiment, blocks=6, seed=3, ttft_run_noise=0.02)
    plan, calibration, blocks, quiet = experiment.load_experiment(tmp_path / "e1", quiet_cores=0.2)
    per_benchmark = plan["run_noise_per_benchmark"]
    assert per_benchmark[next(n for n in per_benchmark if "ttft" in n)] > 10 * per_benchmark[next(n for n in per_benchmark if "tpot" in n)]
    table = experiment.analyse([(plan, calibration, blocks, quiet)], 0.95)["table"]
    largest, own = table["gate run_noise=calibrated"], table["gate run_noise=calibrated per benchmark"]
    assert largest["5%"]["entries_fail"] < 0.5 and largest["5%"]["entries_inconclusive"] > 0.5
    assert own["5%"]["entries_fail"] == 1.0 and own["5% p99"]["entries_fail"] > 0
    assert own["A/A"]["suite_fail"] == 0 and own["5% TTFT (unaffected)"]["entries_fail"] == 0
    assert "gate run_noise=calibrated per benchmark, 2 runs per side" in table


def test_combine_pools_experiments_each_with_its_own_calibration(experiment, tmp_path):
    make_experiment(tmp_path / "e1", experiment, blocks=3, seed=1)
    make_experiment(tmp_path / "e2", experiment, blocks=2, seed=2)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "pooled"), "--combine",
                           str(tmp_path / "e1"), str(tmp_path / "e2")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "gate run_noise=calibrated (n=5)" in done.stdout
    [saved] = (tmp_path / "pooled").glob("summary-*.json")
    summary = json.loads(saved.read_text())
    assert summary["blocks"] == [3, 2] and len(summary["plans"]) == 2
    assert summary["environments"][0]["machine"]["device_name"] == "Test GPU"  # the runs' machine, not this one
    again = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "pooled"), "--combine",
                            str(tmp_path / "e1")], capture_output=True, text=True, env=env)
    assert again.returncode == 2 and "exists" in again.stderr  # a summary folder is never reused

