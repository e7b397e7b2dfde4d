"""The sweep: every file written, nothing overwritten, OOM rows, Ctrl-C keeps what finished, bad input refused."""

import csv
import json

import pytest
import torch

from inferlab.look import tables
from inferlab.suite import sweep
from inferlab.cli import main
from inferlab.decode.engines import EagerEngine, make_engine
from inferlab.errors import UsageError
from inferlab.suite.hypotheses import NOT_ENOUGH_DATA
from inferlab.storage import new_run_folder

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = dict(model="tiny-random", output_lengths=(2, 4, 8), prompt_lengths=(4,), warmup_runs=0, runs=2)


class FailsAtLength:
    """The eager engine, except that a run producing `output_length` tokens raises `error`."""

    def __init__(self, model, output_length: int, error: BaseException) -> None:
        self.inner = EagerEngine(model)
        self.output_length = output_length
        self.error = error
        self.name = "eager"

    def prepare(self, prompt, config):
        self.inner.prepare(prompt, config)

    def run(self, prompt, config, generator, clock):
        if config.max_new_tokens == self.output_length:
            raise self.error
        return self.inner.run(prompt, config, generator, clock)


def fail_at(monkeypatch, output_length, error):
    monkeypatch.setattr(sweep, "make_engine", lambda name, model: FailsAtLength(model, output_length, error))


def run_small(tiny, tmp_path, **overrides):
    folder = new_run_folder(tmp_path, "sweep")
    return sweep.run_sweep(tiny, sweep.SweepConfig(**{**SMALL, **overrides}), folder, (None, "unknown"), sweep.NullProgress())


def test_sweep_writes_each_result_then_json_csv_markdown_and_plots(tiny, tmp_path):
    report = run_small(tiny, tmp_path)
    folder = report.folder
    assert sorted(p.name for p in (folder / "results").iterdir()) == [
        "eager-b1-p4-n2.json", "eager-b1-p4-n4.json", "eager-b1-p4-n8.json"]
    data = json.loads((folder / "sweep.json").read_text())
    assert data["schema"] == sweep.SCHEMA and data["complete"] is True
    assert data["config"]["output_lengths"] == [2, 4, 8]
    assert data["fingerprint"]["model"] == "tiny-random"
    assert [r["config"]["output_length"] for r in data["results"]] == [2, 4, 8]
    assert all(len(r["runs"]) == 2 and r["status"] == "ok" for r in data["results"])
    assert [len(g["verdicts"]) for g in data["hypotheses"]] == [3]
    rows = list(csv.DictReader((folder / "sweep.csv").open()))
    assert [(r["engine"], r["batch_size"], r["prompt_length"], r["output_length"], r["status"]) for r in rows] == [
        ("eager", "1", "4", str(n), "ok") for n in (2, 4, 8)]
    assert float(rows[0]["ttft_ms_p50"]) > 0 and float(rows[2]["tpot_ms_p99"]) > 0
    markdown = (folder / "sweep.md").read_text()
    assert markdown.count("| eager | 1 | 4 |") == 3 and "## Hypotheses" in markdown
    for name in ("ttft.png", "tpot.png", "e2e.png", "output_tokens_per_s.png"):
        assert (folder / name).read_bytes().startswith(PNG_MAGIC)
    assert {p.name for p in report.files} >= {"sweep.json", "sweep.csv", "sweep.md", "e2e.png"}


def test_table_has_a_row_per_configuration_then_verdicts_then_the_folder(tiny, tmp_path):
    report = run_small(tiny, tmp_path)
    text = tables.format_sweep_table(report)
    lines = text.splitlines()
    assert sum(line.startswith("eager ") for line in lines) == 3
    assert "hypotheses, eager, prompt 4, batch 1:" in lines
    for verdict in report.verdicts[0].verdicts:
        assert f"{verdict.verdict.upper():<15} {verdict.name}: {verdict.explanation}" in text
    assert str(report.folder) in lines[-1]


def test_each_engine_is_built_once_for_the_whole_sweep(tiny, tmp_path, monkeypatch):
    built = []

    def counting(name, model):
        built.append(name)
        return make_engine(name, model)

    monkeypatch.setattr(sweep, "make_engine", counting)
    report = run_small(tiny, tmp_path, engines=("eager", "hf"), runs=1)
    assert built == ["eager", "hf"]
    assert [r.config.engine for r in report.results] == ["eager"] * 3 + ["hf"] * 3


def test_a_second_sweep_never_overwrites_the_first(tiny, tmp_path):
    first = run_small(tiny, tmp_path, runs=1)
    before = {p: p.read_bytes() for p in first.folder.rglob("*") if p.is_file()}
    second = run_small(tiny, tmp_path, runs=1)
    assert second.folder != first.folder
    assert {p: p.read_bytes() for p in first.folder.rglob("*") if p.is_file()} == before
    with pytest.raises(UsageError, match="holds an earlier sweep and is kept"):
        sweep.run_sweep(tiny, sweep.SweepConfig(**SMALL), first.folder)
    assert {p: p.read_bytes() for p in first.folder.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("[enforce fail] out of memory\nsecond line"),
])
def test_out_of_memory_on_one_configuration_is_a_row_and_the_others_finish(tiny, tmp_path, monkeypatch, error):
    fail_at(monkeypatch, 4, error)
    report = run_small(tiny, tmp_path)
    assert [r.status for r in report.results] == ["ok", "oom", "ok"]
    failed = report.results[1]
    assert failed.error == str(error).splitlines()[0] and failed.runs == ()
    saved = json.loads((report.folder / "results" / "eager-b1-p4-n4.json").read_text())
    assert (saved["status"], saved["error"]) == ("oom", failed.error)
    rows = list(csv.DictReader((report.folder / "sweep.csv").open()))
    assert [r["status"] for r in rows] == ["ok", "oom", "ok"] and rows[1]["ttft_ms_p50"] == ""
    assert f"OOM: {failed.error}" in tables.format_sweep_table(report)
    # two lengths left: too few to judge a trend
    assert {v.verdict for v in report.verdicts[0].verdicts} == {NOT_ENOUGH_DATA}


def test_other_errors_are_not_taken_for_out_of_memory(tiny, tmp_path, monkeypatch):
    fail_at(monkeypatch, 4, RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_small(tiny, tmp_path)


def test_interrupt_keeps_finished_configurations_and_raises_again(tiny, tmp_path, monkeypatch):
    fail_at(monkeypatch, 4, KeyboardInterrupt())
    folder = new_run_folder(tmp_path, "sweep")
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(tiny, sweep.SweepConfig(**SMALL), folder, (None, "unknown"), sweep.NullProgress())
    assert [p.name for p in (folder / "results").iterdir()] == ["eager-b1-p4-n2.json"]
    data = json.loads((folder / "sweep.json").read_text())
    assert data["complete"] is False
    assert [r["config"]["output_length"] for r in data["results"]] == [2]
    assert len(list(csv.DictReader((folder / "sweep.csv").open()))) == 1
    assert "INTERRUPTED: 1 of 3 configurations" in (folder / "sweep.md").read_text()


def test_output_beyond_the_context_is_refused_before_anything_runs(tiny, tmp_path, monkeypatch):
    fail_at(monkeypatch, 2, AssertionError("nothing may run"))
    with pytest.raises(UsageError, match=r"prompt \(500\) \+ output \(20\) tokens exceed tiny-random's context of 512"):
        sweep.run_sweep(tiny, sweep.SweepConfig(**{**SMALL, "prompt_lengths": (4, 500), "output_lengths": (2, 20)}), tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(output_lengths=(10, 0)), "output lengths must be positive integers, got 0"),
        (dict(output_lengths=()), "no output lengths given: give at least one"),
        (dict(prompt_lengths=(-3,)), "prompt lengths must be positive integers, got -3"),
        (dict(batch_sizes=(0,)), "batch sizes must be positive integers, got 0"),
        (dict(output_lengths=(10, 50, 10)), "output length 10 is given twice: list each output length once"),
        (dict(runs=0), "runs must be at least 1, got 0"),
        (dict(warmup_runs=-1), "warm-up runs must be 0 or more, got -1"),
        (dict(engines=("eager", "vllm")), "unknown engine 'vllm': use one of eager, hf"),
        (dict(engines=()), "no engines given"),
    ],
)
def test_bad_sweep_configurations_are_refused_with_one_line(kwargs, message):
    with pytest.raises(UsageError, match=message) as caught:
        sweep.SweepConfig(**kwargs)
    assert "\n" not in str(caught.value)


def test_tqdm_progress_counts_every_measured_run(capsys):
    progress = sweep.TqdmProgress()
    progress.start(4)
    progress.begin("eager-b1-p4-n2")
    progress.advance()
    progress.advance(3)
    progress.close()
    err = capsys.readouterr().err
    assert "4/4" in err and "eager-b1-p4-n2" in err


def test_cli_sweep_prints_the_table_and_a_verdict_per_hypothesis(capsys, tmp_path):
    code = main(["sweep", "tiny-random", "--device", "cpu", "--output-lengths", "2", "4", "8", "--prompt-lengths", "4",
                 "--runs", "1", "--warmup", "0", "--out", str(tmp_path), "--no-probe"])
    out = capsys.readouterr().out
    assert code == 0
    assert "hypotheses, eager, prompt 4, batch 1:" in out
    for name in ("total latency grows linearly with output length", "TTFT does not depend on output length",
                 "output tokens/s rises and then plateaus"):
        assert sum(name in line and ("HOLDS" in line or "DOES NOT HOLD" in line) for line in out.splitlines()) == 1
    assert len(list(tmp_path.glob("*-sweep/sweep.json"))) == 1


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--output-lengths", "0"], "output lengths must be positive integers, got 0"),
        (["--batch-sizes", "2", "0"], "batch sizes must be positive integers, got 0"),
        (["--engines", "nope"], "unknown engine 'nope'"),
        (["--prompt-lengths", "500", "--output-lengths", "100"], "exceed tiny-random's context of 512"),
    ],
)
def test_cli_bad_sweep_values_give_one_line_and_exit_code_2(capsys, tmp_path, argv, fragment):
    code = main(["sweep", "tiny-random", "--device", "cpu", "--no-probe", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("loading ")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("inferlab: error: ") and fragment in lines[0]
