"""The gate cannot be fooled: a run given twice, too few rounds, hostile files; and its memory stays bounded."""

import json
import os
import shutil

import numpy as np
import pytest

from inferlab.cli import main
from inferlab.suite.gate import judge_report, load, stats
from test_gate import SUITE, entry, noisy_rounds, run_dict, suite_file, write


def gate_cli(capsys, *argv):
    code = main(["gate", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code, err, fragment):
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("inferlab: error: ") and fragment in err, err


def test_one_run_given_twice_on_a_side_is_refused(tmp_path, capsys):
    """The issue's repro: the same base and head given again as repeats; it exited 1 (FAIL) before."""
    base = suite_file(tmp_path / "base.json", seed=1)
    head = suite_file(tmp_path / "head.json", seed=50, factor=1.03)
    code, _, err = gate_cli(capsys, base, head, "--base-runs", base, "--head-runs", head)
    assert_usage_error(code, err, "are the same base run given twice")


def test_a_byte_identical_copy_is_the_same_run(tmp_path, capsys):
    base = suite_file(tmp_path / "base.json", seed=1)
    copy = tmp_path / "copy.json"
    shutil.copyfile(base, copy)
    head = [suite_file(tmp_path / f"head{i}.json", seed=50 + i) for i in range(2)]
    code, _, err = gate_cli(capsys, base, head[0], "--base-runs", copy, "--head-runs", head[1])
    assert_usage_error(code, err, "are the same base run given twice")


def test_distinct_repeats_are_accepted(tmp_path, capsys):
    base = [suite_file(tmp_path / f"a{i}.json", seed=10 * i) for i in range(2)]
    head = [suite_file(tmp_path / f"b{i}.json", seed=100 + 10 * i) for i in range(2)]
    code, out, _ = gate_cli(capsys, base[0], head[0], "--base-runs", base[1], "--head-runs", head[1])
    assert code in (0, 3) and "2 base and 2 head run(s)" in out


@pytest.mark.parametrize("rounds", [1, 2])
def test_runs_too_short_to_show_their_noise_are_refused_not_failed(tmp_path, capsys, rounds):
    """One round per run: the A/A comparisons that FAILed 8 times in 12 now say the gate cannot judge."""
    for seed in range(3):
        base = suite_file(tmp_path / f"a{seed}.json", seed=seed, spread=0.1, n=rounds)
        head = suite_file(tmp_path / f"b{seed}.json", seed=100 + seed, spread=0.1, n=rounds)
        code, _, err = gate_cli(capsys, base, head)
        assert_usage_error(code, err, f"has {rounds} round(s); the gate needs at least {load.MIN_ROUNDS}")


def machine_as_string(data):
    data["machine_info"]["inferlab"] = "cpu"


def huge_rounds(data):
    data["benchmarks"][0]["stats"]["data"] = [1e308, 1e308, 1e308]


def huge_integer_rounds(data):
    data["benchmarks"][0]["stats"]["data"] = [10**400] * 3  # valid JSON; too big for a float


def rounds_not_a_list(data):
    data["benchmarks"][0]["stats"]["data"] = {"a": 1.0}


@pytest.mark.parametrize("spoil, fragment", [
    (machine_as_string, "machine_info.inferlab is a str, not an object"),
    (huge_rounds, "not positive numbers of seconds below"),
    (rounds_not_a_list, "not positive numbers of seconds below"),
    (huge_integer_rounds, "not positive numbers of seconds below"),
])
def test_malformed_fields_are_one_line(tmp_path, capsys, spoil, fragment):
    data = run_dict([entry(case, noisy_rounds(m, i)) for i, (case, m) in enumerate(SUITE.items())])
    spoil(data)
    code, _, err = gate_cli(capsys, write(tmp_path / "bad.json", data), suite_file(tmp_path / "b.json", seed=2))
    assert_usage_error(code, err, fragment)


def test_a_fifo_is_refused_without_reading_it(tmp_path, capsys):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading it would block forever
    code, _, err = gate_cli(capsys, fifo, suite_file(tmp_path / "b.json", seed=2))
    assert_usage_error(code, err, "is not a regular file")


def test_a_device_is_refused(tmp_path, capsys):
    code, _, err = gate_cli(capsys, "/dev/zero", suite_file(tmp_path / "b.json", seed=2))
    assert_usage_error(code, err, "/dev/zero is not a regular file")


def test_an_absurdly_large_file_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(load, "MAX_RUN_BYTES", 1000)
    code, _, err = gate_cli(capsys, suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=2))
    assert_usage_error(code, err, "more than a pytest-benchmark run")


def test_the_bootstrap_draws_in_chunks_and_gets_the_same_values(monkeypatch):
    """Memory is bounded by CHUNK_DRAWS rounds at a time, and chunking changes no replicate."""
    runs = [noisy_rounds(1.0, seed, n=50) for seed in range(3)]
    whole = stats.resampled_mean_log_median(runs, 500, 0.01, np.random.default_rng(7))
    sizes = []

    class Spy:
        def __init__(self, rng):
            self.rng = rng

        def integers(self, *args, size=None, **kwargs):
            sizes.append(int(np.prod(size)))
            return self.rng.integers(*args, size=size, **kwargs)

        def normal(self, *args, **kwargs):
            return self.rng.normal(*args, **kwargs)

    monkeypatch.setattr(stats, "CHUNK_DRAWS", 200)
    chunked = stats.resampled_mean_log_median(runs, 500, 0.01, Spy(np.random.default_rng(7)))
    assert np.array_equal(whole, chunked)
    assert max(sizes[1:]) <= 200  # sizes[0] picks the runs: replicates x runs integers, not rounds


def test_a_report_that_cannot_be_written_exits_4_not_1_after_printing_the_verdict(tmp_path, capsys):
    base = suite_file(tmp_path / "a.json", seed=1)
    slow = suite_file(tmp_path / "b.json", seed=50, factor=1.10)
    code, out, err = gate_cli(capsys, base, slow, "--json", "/proc/self/g.json")
    assert code == 4 and "gate: FAIL" in out  # the verdict is shown; the exit code says the write failed
    assert len(err.splitlines()) == 1 and "cannot write /proc/self/g.json" in err


def test_inputs_are_never_written(tmp_path, capsys):
    base, head = suite_file(tmp_path / "a.json", seed=1), suite_file(tmp_path / "b.json", seed=2)
    before = {p: open(p, "rb").read() for p in (base, head)}
    gate_cli(capsys, base, head, "--json", tmp_path / "r.json")
    assert {p: open(p, "rb").read() for p in (base, head)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "r.html", "r.json"]  # the page beside the JSON
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == judge_report.SCHEMA  # what `inferlab gate` writes
