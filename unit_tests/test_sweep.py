"""The sweep: every file written, nothing overwritten, OOM rows, Ctrl-C keeps what finished, bad input refused."""

import csv
import json
from pathlib import Path

import pytest
import torch

from inferlab.look import tables
from inferlab.suite import hypotheses, sweep, top_up
from inferlab.suite.progress import NullProgress, TqdmProgress
from inferlab.suite.schedule import measurement_order
from inferlab.cli import build_parser, main
from inferlab.decode.engines import EagerEngine, make_engine
from inferlab.errors import UsageError
from inferlab.suite.hypotheses import HOLDS, INCONCLUSIVE, NOT_ENOUGH_DATA
from inferlab.storage import new_run_folder
from inferlab.look.sweep_files import write_outputs

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


class Recording:
    """The eager engine, recording the output length of every run (warm-ups included) and every
    prepare; the `fail_on`-th run (counting from 1) raises `error` instead."""

    def __init__(self, model, fail_on: int | None = None, error: BaseException | None = None) -> None:
        self.inner = EagerEngine(model)
        self.calls, self.prepared = [], []
        self.fail_on, self.error = fail_on, error

    def prepare(self, prompt, config):
        self.prepared.append(config.max_new_tokens)

    def run(self, prompt, config, generator, clock):
        self.calls.append(config.max_new_tokens)
        if len(self.calls) == self.fail_on:
            raise self.error
        return self.inner.run(prompt, config, generator, clock)


def record_runs(monkeypatch, tiny, **kwargs) -> Recording:
    engine = Recording(tiny.model, **kwargs)
    monkeypatch.setattr(sweep, "make_engine", lambda name, model: engine)
    return engine


def fail_at(monkeypatch, output_length, error):
    monkeypatch.setattr(sweep, "make_engine", lambda name, model: FailsAtLength(model, output_length, error))


def run_small(tiny, tmp_path, **overrides):
    folder = new_run_folder(tmp_path, "sweep")
    return sweep.run_sweep(tiny, sweep.SweepConfig(**{**SMALL, **overrides}), folder, (None, "unknown"),
                           NullProgress(), write=write_outputs)


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
    assert "0 warm-up + 2 runs each, interleaved |" in lines[0]
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
        sweep.run_sweep(tiny, sweep.SweepConfig(**SMALL, order="sequential"), folder, (None, "unknown"),
                        NullProgress(), write=write_outputs)
    assert [p.name for p in (folder / "results").iterdir()] == ["eager-b1-p4-n2.json"]
    data = json.loads((folder / "sweep.json").read_text())
    assert data["complete"] is False
    assert [r["config"]["output_length"] for r in data["results"]] == [2]
    assert len(list(csv.DictReader((folder / "sweep.csv").open()))) == 1
    assert "INTERRUPTED: 1 of 3 configurations" in (folder / "sweep.md").read_text()


def test_interleaved_rounds_visit_every_configuration_once_in_an_order_shuffled_anew_each_round():
    slots = measurement_order(5, 6, "interleaved", seed=3)
    rounds = [[s.config for s in slots if s.round == r] for r in range(6)]
    assert all(sorted(visit) == [0, 1, 2, 3, 4] for visit in rounds)
    assert all([s.position for s in slots if s.round == r] == [0, 1, 2, 3, 4] for r in range(6))
    assert len({tuple(visit) for visit in rounds}) > 1  # 6 draws of 120 orders: all equal has odds 120^-5
    assert measurement_order(5, 6, "interleaved", seed=3) == slots  # the seed recorded repeats it
    assert measurement_order(5, 6, "interleaved", seed=4) != slots


def test_sequential_order_measures_each_configuration_back_to_back():
    slots = measurement_order(3, 2, "sequential", seed=0)
    assert [(s.config, s.round, s.position) for s in slots] == [(0, 0, 0), (0, 1, 0), (1, 0, 1), (1, 1, 1), (2, 0, 2), (2, 1, 2)]


def test_interleaved_sweep_prepares_and_warms_up_every_configuration_first_then_measures_in_rounds(tiny, tmp_path,
                                                                                                  monkeypatch):
    engine = record_runs(monkeypatch, tiny)
    report = run_small(tiny, tmp_path, warmup_runs=1, runs=3, seed=5)
    assert engine.prepared == [2, 4, 8]  # once per configuration, not once per round
    assert engine.calls[:3] == [2, 4, 8]  # the warm-ups, before any measured run
    slots = measurement_order(3, 3, "interleaved", 5)
    assert engine.calls[3:] == [(2, 4, 8)[s.config] for s in slots]
    data = json.loads((report.folder / "sweep.json").read_text())
    assert data["config"]["order"] == "interleaved" and data["config"]["seed"] == 5
    starts = {}
    for result in data["results"]:
        schedule = result["schedule"]
        assert len(schedule) == len(result["runs"]) == 3
        assert [entry["round"] for entry in schedule] == [0, 1, 2]
        index = (2, 4, 8).index(result["config"]["output_length"])
        assert [entry["position"] for entry in schedule] == [s.position for s in slots if s.config == index]
        starts.update({(e["round"], e["position"]): e["start_s"] for e in schedule})
        saved = json.loads((report.folder / "results" / f"eager-b1-p4-n{result['config']['output_length']}.json").read_text())
        assert saved["schedule"] == schedule
    in_order = [starts[key] for key in sorted(starts)]
    assert in_order[0] == 0.0 and in_order == sorted(in_order) and len(set(in_order)) == 9


def test_interrupt_in_a_round_keeps_every_run_measured_and_raises_again(tiny, tmp_path, monkeypatch):
    record_runs(monkeypatch, tiny, fail_on=5, error=KeyboardInterrupt())  # the second run of round 1
    folder = new_run_folder(tmp_path, "sweep")
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(tiny, sweep.SweepConfig(**{**SMALL, "runs": 3}), folder, (None, "unknown"),
                        NullProgress(), write=write_outputs)
    slots = measurement_order(3, 3, "interleaved", 0)[:4]
    measured = {n: sum((2, 4, 8)[s.config] == n for s in slots) for n in (2, 4, 8)}
    data = json.loads((folder / "sweep.json").read_text())
    assert data["complete"] is False
    assert {r["config"]["output_length"]: len(r["runs"]) for r in data["results"]} == measured
    for n, count in measured.items():
        saved = json.loads((folder / "results" / f"eager-b1-p4-n{n}.json").read_text())
        assert len(saved["runs"]) == len(saved["schedule"]) == count


def test_out_of_memory_in_a_later_round_makes_that_configuration_a_row_and_the_others_finish(tiny, tmp_path,
                                                                                            monkeypatch):
    error = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    slots = measurement_order(3, 2, "interleaved", 0)
    engine = record_runs(monkeypatch, tiny, fail_on=4, error=error)  # the first run of round 1
    report = run_small(tiny, tmp_path)
    failed = (2, 4, 8)[slots[3].config]
    assert {r.config.output_length: (r.status, len(r.runs)) for r in report.results} == {
        n: ("oom", 0) if n == failed else ("ok", 2) for n in (2, 4, 8)}
    assert engine.calls.count(failed) == 2  # not measured again after its failure
    saved = json.loads((report.folder / "results" / f"eager-b1-p4-n{failed}.json").read_text())
    assert saved["status"] == "oom" and saved["schedule"] == []


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
        (dict(order="random"), "unknown order 'random': use interleaved or sequential"),
        (dict(inject_delay_per_position_us=-1.0), "the injected delay per position must be >= 0 us, got -1.0"),
        (dict(runs=3, max_runs=2), r"max runs must be 0 \(no top-up\) or at least runs \(3\), got 2"),
        (dict(max_runs=True), "max runs must be 0"),
        (dict(runs=3, max_runs=10, order="sequential"), "max runs 10 above runs 3 tops up in interleaved rounds"),
        (dict(top_up_s=-1.0), "the top-up budget must be a finite number of seconds >= 0, got -1.0"),
        (dict(top_up_s=float("inf")), "the top-up budget must be a finite number of seconds >= 0, got inf"),
    ],
)
def test_bad_sweep_configurations_are_refused_with_one_line(kwargs, message):
    with pytest.raises(UsageError, match=message) as caught:
        sweep.SweepConfig(**kwargs)
    assert "\n" not in str(caught.value)


def test_tqdm_progress_counts_every_measured_run(capsys):
    progress = TqdmProgress()
    progress.start(4)
    progress.begin("eager-b1-p4-n2")
    progress.advance()
    progress.advance(3)
    progress.close()
    err = capsys.readouterr().err
    assert "4/4" in err and "eager-b1-p4-n2" in err


def test_cli_sweep_prints_the_table_and_a_verdict_per_hypothesis(capsys, tmp_path):
    code = main(["sweep", "tiny-random", "--device", "cpu", "--output-lengths", "2", "4", "8", "--prompt-lengths", "4",
                 "--runs", "1", "--warmup", "0", "--out", str(tmp_path), "--no-probe", "--max-runs", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "hypotheses, eager, prompt 4, batch 1:" in out
    for name in ("total latency grows linearly with output length", "TTFT does not depend on output length",
                 "output tokens/s rises and then plateaus"):
        # one run per length: the noise cannot be estimated, so no verdict either way
        assert sum(name in line and "INCONCLUSIVE" in line and "too few runs" in line for line in out.splitlines()) == 1
    assert len(list(tmp_path.glob("*-sweep/sweep.json"))) == 1


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--output-lengths", "0"], "output lengths must be positive integers, got 0"),
        (["--batch-sizes", "2", "0"], "batch sizes must be positive integers, got 0"),
        (["--engines", "nope"], "unknown engine 'nope'"),
        (["--prompt-lengths", "500", "--output-lengths", "100"], "exceed tiny-random's context of 512"),
        (["--order", "sequential", "--runs", "3", "--max-runs", "5"],
         "max runs 5 above runs 3 tops up in interleaved rounds: use order interleaved, or max runs 0 with order sequential"),
        (["--runs", "3", "--max-runs", "2"], "max runs must be 0 (no top-up) or at least runs (3), got 2"),
        (["--top-up-s", "-5"], "the top-up budget must be a finite number of seconds >= 0, got -5.0"),
        (["--layout", "tp:2", "--max-runs", "12"], "each tensor-parallel rank would judge on its own timings"),
    ],
)
def test_cli_bad_sweep_values_give_one_line_and_exit_code_2(capsys, tmp_path, argv, fragment):
    code = main(["sweep", "tiny-random", "--device", "cpu", "--no-probe", "--out", str(tmp_path), *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("loading ")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("inferlab: error: ") and fragment in lines[0]


def test_cli_sweep_records_the_order_asked_for(tmp_path, capsys):
    code = main(["sweep", "tiny-random", "--device", "cpu", "--output-lengths", "2", "4", "--prompt-lengths", "4",
                 "--runs", "1", "--warmup", "0", "--out", str(tmp_path), "--no-probe", "--order", "sequential"])
    assert code == 0
    data = json.loads(next(tmp_path.glob("*-sweep/sweep.json")).read_text())
    assert data["config"]["order"] == "sequential" and data["config"]["inject_delay_per_position_us"] == 0.0


@pytest.fixture
def one_thread():
    """One intra-op thread: on a busy 2-core machine, waking a second OpenMP thread after each host
    wait can cost more than the step itself, and that noise would drown what the test looks for."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.timing
def test_a_delay_growing_with_the_cache_position_is_caught_by_a_real_sweep(tmp_path, capsys, one_thread):
    # 2 ms per cached position: TPOT gains 2 * (P + N/2 - 1) ms, 10 ms at N=4 and 38 ms at N=32, far
    # beyond what tiny-random's KV cache (a few KB per step) predicts, and beyond a busy CPU's noise.
    code = main(["sweep", "tiny-random", "--device", "cpu", "--output-lengths", "4", "12", "32", "--prompt-lengths", "4",
                 "--runs", "5", "--warmup", "1", "--out", str(tmp_path), "--no-probe",
                 "--inject-delay-per-position-us", "2000"])
    assert code == 0
    data = json.loads(next(tmp_path.glob("*-sweep/sweep.json")).read_text())
    assert data["config"]["inject_delay_per_position_us"] == 2000.0
    assert all(r["config"]["inject_delay_per_position_us"] == 2000.0 for r in data["results"])
    linear = data["hypotheses"][0]["verdicts"][0]
    assert linear["name"] == "total latency grows linearly with output length"
    assert linear["verdict"] == "does not hold", linear["explanation"]
    assert linear["numbers"]["measured_growth"] > linear["numbers"]["predicted_growth"] + 0.1
    assert "DOES NOT HOLD   total latency grows linearly" in capsys.readouterr().out


def test_default_engines_are_eager_hf_and_fast_on_cuda_and_eager_on_the_cpu():
    assert sweep.default_engines(torch.device("cuda")) == ("eager", "hf", "fast")
    assert sweep.default_engines(torch.device("cuda"), split=True) == ("eager", "hf")  # fast runs on one device
    assert sweep.default_engines(torch.device("cpu")) == ("eager",)
    assert sweep.SweepConfig().engines == ("eager",) and sweep.SweepConfig().prompt_lengths == (128,)
    assert sweep.SweepConfig().output_lengths == (10, 50, 100, 500)
    assert (sweep.SweepConfig().warmup_runs, sweep.SweepConfig().runs) == (1, 5)
    args = build_parser().parse_args(["sweep"])
    assert (args.warmup, args.runs, args.engines, args.order) == (1, 5, None, "interleaved")  # None: by device


# ----------------------------------------------------------------------------- top-up rounds

NAMES = (hypotheses.LINEAR_LATENCY, hypotheses.TTFT_INDEPENDENT, hypotheses.TOKENS_PLATEAU)
TWO_GROUPS = dict(SMALL, prompt_lengths=(4, 6), runs=3, max_runs=10)  # configurations 0-2: prompt 4; 3-5: prompt 6


def judge_scripted(monkeypatch, decided) -> list:
    """The groups' verdicts, scripted: all three HOLD once `decided(prompt length, fewest runs per length)`,
    else all three are INCONCLUSIVE. Returns the list of every judgement's {prompt length: fewest runs}."""
    looks = []

    def judged(groups):
        looks.append({key[1]: min((len(runs) for _, runs, *_ in members), default=0) for key, members in groups.items()})
        verdicts = []
        for (engine, prompt, batch), members in groups.items():
            answer = HOLDS if decided(prompt, looks[-1][prompt]) else INCONCLUSIVE
            verdicts.append(sweep.GroupVerdicts(engine, prompt, batch,
                                                tuple(hypotheses.Verdict(n, answer, {}, "scripted") for n in NAMES)))
        return tuple(verdicts)

    monkeypatch.setattr(sweep, "_judged", judged)
    return looks


def spy_saves(monkeypatch, engine=None) -> list:
    """Every results file written: (file name, runs measured by then)."""
    saves = []
    real = sweep.save_json_or_fallback

    def spy(path, data):
        saves.append((path.name, None if engine is None else len(engine.calls)))
        return real(path, data)

    monkeypatch.setattr(sweep, "save_json_or_fallback", spy)
    return saves


class CountingProgress(NullProgress):
    def __init__(self) -> None:
        self.total = self.done = 0

    def start(self, total: int) -> None:
        self.total = total

    def grow(self, steps: int) -> None:
        self.total += steps

    def advance(self, steps: int = 1) -> None:
        self.done += steps


def sweep_with(tiny, tmp_path, config, progress=None, clock=None):
    folder = new_run_folder(tmp_path, "sweep")
    extra = {} if clock is None else {"clock": clock}
    return sweep.run_sweep(tiny, config, folder, (None, "unknown"), progress or NullProgress(), write=write_outputs,
                           **extra)


def stems(prompt: int) -> list[str]:
    return [f"eager-b1-p{prompt}-n{n}.json" for n in (2, 4, 8)]


def test_top_up_rounds_measure_only_the_undecided_groups_and_stop_once_decided(tiny, tmp_path, monkeypatch):
    engine = record_runs(monkeypatch, tiny)
    looks = judge_scripted(monkeypatch, lambda prompt, runs: prompt == 4 or runs >= 5)
    progress = CountingProgress()
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**TWO_GROUPS, seed=7), progress)
    # judged after the base rounds and after each top-up round, then once more for the report
    assert looks == [{4: 3, 6: 3}, {4: 3, 6: 4}, {4: 3, 6: 5}, {4: 3, 6: 5}]
    assert {(r.prompt_length, r.config.output_length): len(r.runs) for r in report.results} == {
        **{(4, n): 3 for n in (2, 4, 8)}, **{(6, n): 5 for n in (2, 4, 8)}}
    assert len(engine.calls) == 6 * 3 + 2 * 3 and (progress.total, progress.done) == (24, 24)
    slots = measurement_order(6, 3, "interleaved", 7, top_up_rounds=[[3, 4, 5], [3, 4, 5]])
    assert engine.calls == [(2, 4, 8, 2, 4, 8)[s.config] for s in slots]  # the base rounds' generator, continued
    data = json.loads((report.folder / "sweep.json").read_text())
    assert data["config"]["max_runs"] == 10 and data["config"]["top_up_s"] == sweep.DEFAULT_TOP_UP_S
    assert data["top_up"]["groups"] == [
        {"engine": "eager", "prompt_length": 4, "batch_size": 1, "rounds": 0, "stopped": "decided"},
        {"engine": "eager", "prompt_length": 6, "batch_size": 1, "rounds": 2, "stopped": "decided"}]
    by_index = ["eager-b1-p4-n2", "eager-b1-p4-n4", "eager-b1-p4-n8", "eager-b1-p6-n2", "eager-b1-p6-n4", "eager-b1-p6-n8"]
    assert data["top_up"]["rounds"] == [{"round": r, "order": [by_index[s.config] for s in slots if s.round == r]}
                                        for r in (3, 4)]
    for result in data["results"]:
        index = by_index.index(f"eager-b1-p{result['prompt_length']}-n{result['config']['output_length']}")
        assert [(e["round"], e["position"]) for e in result["schedule"]] == [(s.round, s.position) for s in slots
                                                                            if s.config == index]
    text = tables.format_sweep_table(report)
    assert "0 warm-up + 3 runs each, up to 10 where undecided, interleaved |" in text
    lines = text.splitlines()
    assert lines[lines.index("hypotheses, eager, prompt 4, batch 1:") + 1] == "  3 runs per length; decided without top-up"
    assert lines[lines.index("hypotheses, eager, prompt 6, batch 1:") + 1] == (
        "  5 runs per length (2 top-up rounds); top-up stopped: decided")
    assert "5 runs per length (2 top-up rounds); top-up stopped: decided." in (report.folder / "sweep.md").read_text()
    page = (report.folder / "sweep.html").read_text()
    assert "5 runs per length (2 top-up rounds); top-up stopped: decided" in page and "up to 10 where undecided" in page


def test_each_result_file_is_written_once_when_its_group_stops(tiny, tmp_path, monkeypatch):
    engine = record_runs(monkeypatch, tiny)
    judge_scripted(monkeypatch, lambda prompt, runs: prompt == 4 or runs >= 5)
    saves = spy_saves(monkeypatch, engine)
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**TWO_GROUPS))
    # prompt 4 is final after the base rounds (18 runs), prompt 6 after two top-up rounds (24)
    assert sorted(saves) == sorted([(name, 18) for name in stems(4)] + [(name, 24) for name in stems(6)])
    for name in stems(6):
        saved = json.loads((report.folder / "results" / name).read_text())
        assert len(saved["runs"]) == len(saved["schedule"]) == 5 and saved["memory"] is not None


def test_top_up_stops_at_max_runs(tiny, tmp_path, monkeypatch):
    engine = record_runs(monkeypatch, tiny)
    judge_scripted(monkeypatch, lambda prompt, runs: False)
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**{**SMALL, "runs": 3, "max_runs": 5}))
    assert [len(r.runs) for r in report.results] == [5, 5, 5] and len(engine.calls) == 15
    assert report.top_up_groups == (top_up.GroupTopUp("eager", 4, 1, 2, top_up.MAX_RUNS),)
    assert {v.verdict for v in report.verdicts[0].verdicts} == {INCONCLUSIVE}  # reported as they stand
    assert "  5 runs per length (2 top-up rounds); top-up stopped: reached the most runs" in (
        tables.format_sweep_table(report).splitlines())


class FakeClock:
    """Seconds that pass only when a run is measured: each run takes `run_s`."""

    def __init__(self, run_s: float) -> None:
        self.now, self.run_s = 0.0, run_s

    def __call__(self) -> float:
        return self.now


def test_top_up_stops_before_a_round_that_would_end_past_its_budget(tiny, tmp_path, monkeypatch):
    clock = FakeClock(10.0)
    engine = record_runs(monkeypatch, tiny)
    inner_run = engine.run

    def slow_run(prompt, config, generator, run_clock):
        clock.now += clock.run_s
        return inner_run(prompt, config, generator, run_clock)

    monkeypatch.setattr(engine, "run", slow_run)
    judge_scripted(monkeypatch, lambda prompt, runs: False)
    # a round of 3 configurations is estimated at 30 s: after 2 rounds (60 s) a third would end at 90 s > 70 s
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**{**SMALL, "runs": 3, "max_runs": 10, "top_up_s": 70.0}),
                        clock=clock)
    assert [len(r.runs) for r in report.results] == [5, 5, 5]
    assert report.top_up_groups == (top_up.GroupTopUp("eager", 4, 1, 2, top_up.BUDGET),)
    starts = sorted(s.start_s for schedule in report.schedules.values() for s in schedule)
    assert starts == [10.0 * k for k in range(15)]
    assert "top-up stopped: the top-up's time was spent" in tables.format_sweep_table(report)


def test_a_zero_budget_reports_the_base_runs_and_why_there_was_no_top_up(tiny, tmp_path, monkeypatch):
    engine = record_runs(monkeypatch, tiny)
    judge_scripted(monkeypatch, lambda prompt, runs: False)
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**{**SMALL, "runs": 3, "max_runs": 10, "top_up_s": 0.0}))
    assert len(engine.calls) == 9 and report.top_up_groups == (top_up.GroupTopUp("eager", 4, 1, 0, top_up.BUDGET),)


@pytest.mark.parametrize("max_runs", [0, 3])
def test_without_top_up_each_result_is_saved_after_its_last_base_run_and_judged_once(tiny, tmp_path, monkeypatch,
                                                                                   max_runs):
    engine = record_runs(monkeypatch, tiny)
    looks = judge_scripted(monkeypatch, lambda prompt, runs: False)  # undecided, yet nothing more is measured
    saves = spy_saves(monkeypatch, engine)
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**{**SMALL, "runs": 3, "max_runs": max_runs}))
    slots = measurement_order(3, 3, "interleaved", 0)
    assert engine.calls == [(2, 4, 8)[s.config] for s in slots]
    last_run = {f"eager-b1-p4-n{(2, 4, 8)[s.config]}.json": k + 1 for k, s in enumerate(slots)}
    assert sorted(saves) == sorted(last_run.items())
    assert len(looks) == 1 and report.top_up_groups == () and report.top_up_rounds == ()
    data = json.loads((report.folder / "sweep.json").read_text())
    assert data["top_up"] is None and data["config"]["max_runs"] == max_runs
    text = tables.format_sweep_table(report)
    assert "0 warm-up + 3 runs each, interleaved |" in text and "runs per length" not in text


def test_a_sequential_sweep_may_name_max_runs_equal_to_runs():
    assert not sweep.SweepConfig(runs=3, max_runs=3, order="sequential").tops_up
    assert sweep.SweepConfig(runs=3, max_runs=4).tops_up and not sweep.SweepConfig(runs=3).tops_up


def test_interrupt_during_top_up_saves_what_was_measured_and_raises_again(tiny, tmp_path, monkeypatch):
    engine = record_runs(monkeypatch, tiny, fail_on=11, error=KeyboardInterrupt())  # the second run of round 3
    judge_scripted(monkeypatch, lambda prompt, runs: False)
    saves = spy_saves(monkeypatch)
    folder = new_run_folder(tmp_path, "sweep")
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(tiny, sweep.SweepConfig(**{**SMALL, "runs": 3, "max_runs": 10}), folder, (None, "unknown"),
                        NullProgress(), write=write_outputs)
    slots = measurement_order(3, 3, "interleaved", 0, top_up_rounds=[[0, 1, 2]])[:10]
    measured = {n: sum((2, 4, 8)[s.config] == n for s in slots) for n in (2, 4, 8)}
    assert sorted(measured.values()) == [3, 3, 4] and len(engine.calls) == 11
    assert sorted(name for name, _ in saves) == stems(4)  # each once
    data = json.loads((folder / "sweep.json").read_text())
    assert data["complete"] is False
    assert data["top_up"]["groups"] == [{"engine": "eager", "prompt_length": 4, "batch_size": 1, "rounds": 1,
                                         "stopped": "interrupted"}]
    for n, count in measured.items():
        saved = json.loads((folder / "results" / f"eager-b1-p4-n{n}.json").read_text())
        assert len(saved["runs"]) == count and [e["round"] for e in saved["schedule"]] == list(range(count))


def test_out_of_memory_in_a_top_up_round_makes_that_configuration_a_row_and_the_group_goes_on(tiny, tmp_path,
                                                                                           monkeypatch):
    error = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    engine = record_runs(monkeypatch, tiny, fail_on=11, error=error)  # the second run of round 3
    judge_scripted(monkeypatch, lambda prompt, runs: False)
    saves = spy_saves(monkeypatch)
    progress = CountingProgress()
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**{**SMALL, "runs": 3, "max_runs": 5}), progress)
    round_3 = [s.config for s in measurement_order(3, 3, "interleaved", 0, top_up_rounds=[[0, 1, 2]])[9:]]
    failed = (2, 4, 8)[round_3[1]]
    assert {r.config.output_length: (r.status, len(r.runs)) for r in report.results} == {
        n: ("oom", 0) if n == failed else ("ok", 5) for n in (2, 4, 8)}
    assert engine.calls.count(failed) == 4  # three base runs and the one that failed, none after
    assert sorted(name for name, _ in saves) == stems(4)  # the oom row once, the others once when final
    assert report.top_up_groups == (top_up.GroupTopUp("eager", 4, 1, 2, top_up.MAX_RUNS),)
    assert progress.done == progress.total == 9 + 3 + 2


def test_real_verdicts_end_the_top_up_decided_or_at_max_runs(tiny, tmp_path):
    report = sweep_with(tiny, tmp_path, sweep.SweepConfig(**{**SMALL, "runs": 3, "max_runs": 4}))
    (record,) = report.top_up_groups
    counts = {len(r.runs) for r in report.results}
    if record.stopped == top_up.DECIDED:
        assert not top_up.is_undecided(report.verdicts[0].verdicts) and counts == {3 + record.rounds}
    else:
        assert (record.stopped, record.rounds, counts) == (top_up.MAX_RUNS, 1, {4})


def test_cli_sweep_passes_the_top_up_flags_and_tops_up_only_when_asked(tmp_path, capsys):
    base = ["sweep", "tiny-random", "--device", "cpu", "--output-lengths", "2", "4", "--prompt-lengths", "4",
            "--warmup", "0", "--no-probe"]
    for extra, expected in [
        (["--runs", "3"], (0, 180.0)),
        (["--runs", "3", "--max-runs", "10"], (10, 180.0)),
        (["--runs", "2", "--max-runs", "4", "--top-up-s", "30"], (4, 30.0)),
        (["--runs", "2", "--max-runs", "0"], (0, 180.0)),
        (["--runs", "2", "--order", "sequential"], (0, 180.0)),
        (["--runs", "2", "--order", "sequential", "--max-runs", "2"], (2, 180.0)),
    ]:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        assert main([*base, *extra, "--out", str(out)]) == 0, capsys.readouterr().err
        data = json.loads(next(out.glob("*-sweep/sweep.json")).read_text())
        assert (data["config"]["max_runs"], data["config"]["top_up_s"]) == expected, extra
    assert "0 warm-up + 2 runs each, up to 4 where undecided, interleaved" in capsys.readouterr().out


def test_the_main_job_tops_up_to_10_runs():
    """`tox -e sweep` (the README's main job) asks for the top-up that `inferlab sweep` leaves off by default."""
    import configparser

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).resolve().parents[1] / "tox.ini")
    command = tox["testenv:sweep"]["commands"].strip()
    assert command == "inferlab sweep {posargs:--warmup 1 --runs 3 --max-runs 10}"


def test_tqdm_progress_grows_its_total_with_top_up_rounds(capsys):
    progress = TqdmProgress()
    progress.start(2)
    progress.advance(2)
    progress.grow(3)
    progress.advance(3)
    progress.close()
    assert "5/5" in capsys.readouterr().err


def test_the_stop_rule_without_a_clock_judges_one_more_run_at_a_time_until_decided_or_max_runs():
    def judge_deciding_at(decided_at):
        looks = []

        def judge(n, confidence):
            looks.append((n, confidence))
            answer = HOLDS if n >= decided_at else INCONCLUSIVE
            return tuple(hypotheses.Verdict(name, answer, {}, "scripted") for name in NAMES)

        return judge, looks

    judge, looks = judge_deciding_at(5)
    verdicts, used = top_up.judge_topped_up(judge, 3, 10, 0.95)
    assert used == 5 and looks == [(3, 0.95), (4, 0.95), (5, 0.95)] and not top_up.is_undecided(verdicts)
    judge, looks = judge_deciding_at(99)
    verdicts, used = top_up.judge_topped_up(judge, 3, 10, 0.95)
    assert used == 10 and [n for n, _ in looks] == list(range(3, 11)) and top_up.is_undecided(verdicts)
    not_enough = (hypotheses.Verdict(NAMES[0], NOT_ENOUGH_DATA, {}, "two lengths"),)
    assert not top_up.is_undecided(not_enough)  # more runs add no lengths


@pytest.mark.parametrize("order, runs, paired", [("interleaved", 5, True), ("interleaved", 4, False),
                                                 ("sequential", 5, False)])
def test_an_interleaved_sweep_of_enough_rounds_judges_its_runs_paired_by_round(tiny, tmp_path, order, runs, paired):
    report = run_small(tiny, tmp_path, runs=runs, order=order)
    verdicts = report.verdicts[0].verdicts
    assert [v.numbers["paired_by_round"] for v in verdicts] == [paired] * 3
    assert [("runs paired by round" in v.explanation) for v in verdicts] == [paired] * 3
    saved = json.loads((report.folder / "sweep.json").read_text())  # judged again from the saved schedule: the same
    assert sweep.saved_group_verdicts(saved)[0].verdicts == verdicts
