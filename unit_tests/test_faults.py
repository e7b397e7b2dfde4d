"""Faults that must not lose a measurement: CPU out of memory, a configuration too big to fit, SIGTERM, a full disk."""

import errno
import json
import os
import signal

import pytest
import torch

from inferlab.cli import main
from inferlab.decode.engines import EagerEngine
from inferlab.errors import DoesNotFit
from inferlab.model import fit
from inferlab.storage import new_run_folder
from inferlab.suite import progress, sweep
from inferlab.look.sweep_files import write_outputs

SMALL = dict(model="tiny-random", output_lengths=(2, 4, 8), prompt_lengths=(4,), warmup_runs=0, runs=2)
CPU_OOM = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 6442450944 bytes. "
                       "Error code 12 (Cannot allocate memory)")


class FailsAtLength:
    """The eager engine, except that a run producing `output_length` tokens calls `fail()`."""

    def __init__(self, model, output_length, fail):
        self.inner, self.output_length, self.fail = EagerEngine(model), output_length, fail
        self.name = "eager"

    def prepare(self, prompt, config):
        self.inner.prepare(prompt, config)

    def run(self, prompt, config, generator, clock):
        if config.max_new_tokens == self.output_length:
            self.fail()
        return self.inner.run(prompt, config, generator, clock)


def raise_(error):
    def fail():
        raise error
    return fail


def run_small(tiny, tmp_path, monkeypatch, fail):
    monkeypatch.setattr(sweep, "make_engine", lambda name, model: FailsAtLength(model, 4, fail))
    folder = new_run_folder(tmp_path, "sweep")
    return sweep.run_sweep(tiny, sweep.SweepConfig(**SMALL), folder, (None, "unknown"),
                           progress.NullProgress(), write=write_outputs)


@pytest.mark.parametrize("error", [CPU_OOM, MemoryError()], ids=["DefaultCPUAllocator", "MemoryError"])
def test_cpu_out_of_memory_is_the_configurations_row_and_the_sweep_goes_on(tiny, tmp_path, monkeypatch, error):
    report = run_small(tiny, tmp_path, monkeypatch, raise_(error))
    assert [r.status for r in report.results] == ["ok", "oom", "ok"]
    saved = json.loads((report.folder / "sweep.json").read_text())
    assert [r["status"] for r in saved["results"]] == ["ok", "oom", "ok"] and saved["complete"] is True


def test_only_out_of_memory_errors_are_taken_for_it():
    assert sweep.is_out_of_memory(CPU_OOM) and sweep.is_out_of_memory(MemoryError())
    assert not sweep.is_out_of_memory(RuntimeError("shape mismatch")) and not sweep.is_out_of_memory(ValueError("x"))


def test_a_configuration_that_cannot_fit_is_refused_before_allocating(tiny):
    # tiny-random: 512 bytes of KV cache per position; 10^8 rows x 136 positions is ~7 TB.
    need = fit.need_bytes(tiny.model.config, torch.float32, 100_000_000, 128, 8)
    assert need >= 512 * 100_000_000 * 136
    with pytest.raises(DoesNotFit, match=r"batch 100000000 x \(prompt 128 \+ output 8\) tokens needs at least"):
        fit.check_memory(tiny, 100_000_000, 128, 8, free=64 * 2**30)
    fit.check_memory(tiny, 1, 128, 8, free=64 * 2**30)  # a small one passes


def test_free_cpu_memory_is_known_here():
    free = fit.free_bytes(torch.device("cpu"))
    assert free is not None and free > 0


def test_bench_with_a_huge_batch_is_one_line_exit_5(capsys, tmp_path):
    code = main(["bench", "tiny-random", "--device", "cpu", "--batch-size", "100000000", "--prompt-length", "8",
                 "--output-length", "4", "--runs", "1", "--warmup", "0", "--no-probe", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("loading ")]
    assert code == 5 and len(lines) == 1 and lines[0].startswith("inferlab: out of memory: batch 100000000"), err


def test_a_sweep_refusal_for_memory_is_that_configurations_oom_row(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(fit, "free_bytes", lambda device: 200_000)  # fits batch 1, not batch 64
    folder = new_run_folder(tmp_path, "sweep")
    config = sweep.SweepConfig(**{**SMALL, "output_lengths": (2,), "batch_sizes": (1, 64)})
    report = sweep.run_sweep(tiny, config, folder, (None, "unknown"), progress.NullProgress(), write=write_outputs)
    assert [(r.config.batch_size, r.status) for r in report.results] == [(1, "ok"), (64, "oom")]
    assert "needs at least" in report.results[1].error


def test_sigterm_during_a_sweep_writes_the_summary_and_exits_143(tmp_path, capsys, monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(sweep, "make_engine",
                        lambda name, model: FailsAtLength(model, 4, lambda: os.kill(os.getpid(), signal.SIGTERM)))
    code = main(["sweep", "tiny-random", "--device", "cpu", "--output-lengths", "2", "4", "8", "--prompt-lengths", "4",
                 "--runs", "2", "--warmup", "0", "--no-probe", "--order", "sequential", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 143 and "stopped by SIGTERM: finished configurations are saved in" in err
    (folder,) = tmp_path.iterdir()
    data = json.loads((folder / "sweep.json").read_text())
    assert data["complete"] is False and [r["config"]["output_length"] for r in data["results"]] == [2]
    assert (folder / "sweep.csv").is_file() and (folder / "sweep.md").is_file()
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone again


def fail_fsync(monkeypatch, times):
    real = os.fsync
    calls = {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] <= times:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


BENCH = ["bench", "tiny-random", "--device", "cpu", "--prompt-length", "4", "--output-length", "3",
         "--runs", "2", "--warmup", "0", "--no-probe"]


def test_a_full_disk_saves_the_measurement_to_a_fallback_named_on_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "fallback"))
    (tmp_path / "fallback").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    fail_fsync(monkeypatch, times=1)
    code = main(BENCH + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.splitlines()[-1]
    assert code == 4 and "No space left on device" in err and "saved instead to" in err
    (saved,) = (tmp_path / "fallback").glob("inferlab-unsaved-*-bench.json")
    assert str(saved) in err and len(json.loads(saved.read_text())["runs"]) == 2


def test_when_no_file_can_be_written_the_measurement_is_printed_in_full(tmp_path, capsys, monkeypatch):
    fail_fsync(monkeypatch, times=2)
    code = main(BENCH + ["--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 4 and "printed in full on stdout instead" in err.splitlines()[-1]
    saved = json.loads(out[out.index("{\n"):])
    assert saved["schema"] == "inferlab.bench/1" and len(saved["runs"]) == 2
