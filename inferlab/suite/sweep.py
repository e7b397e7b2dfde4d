"""The output-length experiment: every (engine, batch, prompt, output length), saved as it finishes.

A run folder (made new by `storage.new_run_folder`, so nothing earlier is overwritten) gets:

- ``results/<engine>-b<B>-p<P>-n<N>.json``: each configuration's `BenchResult`, written when
  it finishes, so an interrupt keeps it;
- ``sweep.json`` (schema ``inferlab.sweep/1``: config, fingerprint, every result, verdicts),
  ``sweep.csv`` (one row per configuration), ``sweep.md`` (table and verdicts) and the four
  PNG plots of `inferlab.look.plots`, written at the end, or for the finished configurations when
  the sweep is interrupted.

Each engine is built once for the whole sweep, so a compiling engine compiles once; the time
its `prepare` takes for each configuration is in that result's ``prepare_ms``. A configuration
that runs out of device memory becomes an "oom" row and the sweep goes on.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol, Sequence

import torch

from inferlab.measure import fingerprint as fingerprints
from inferlab.suite import hypotheses
from inferlab.look import plots
from inferlab.look.tables import csv_text, markdown_text, title
from inferlab.measure.bench import BenchConfig, BenchResult, check_fits, failed_result, run_benchmark
from inferlab.model.devices import dtype_name
from inferlab.decode.engines import ENGINE_NAMES, make_engine
from inferlab.errors import UsageError
from inferlab.model.registry import LoadedModel
from inferlab.decode.sampling import SamplingConfig
from inferlab.storage import save_json_or_fallback, write_json_atomic, write_text_atomic

SCHEMA = "inferlab.sweep/1"


def _check_unique(values: tuple, what: str) -> None:
    repeated = [v for v in dict.fromkeys(values) if values.count(v) > 1]
    if repeated:
        raise UsageError(f"{what} {repeated[0]} is given twice: list each {what} once")


def _check_positive(values: tuple, what: str) -> None:
    if not values:
        raise UsageError(f"no {what}s given: give at least one")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"{what}s must be positive integers, got {value}")
    _check_unique(values, what)


@dataclass(frozen=True)
class SweepConfig:
    """The grid to measure: engines x batch sizes x prompt lengths x output lengths."""

    model: str = ""  # as asked for; "" for the device's default (the fingerprint names the model loaded)
    engines: tuple[str, ...] = ("eager",)
    output_lengths: tuple[int, ...] = (10, 50, 100, 500)
    prompt_lengths: tuple[int, ...] = (128,)
    batch_sizes: tuple[int, ...] = (1,)
    warmup_runs: int = 2
    runs: int = 5
    seed: int = 0
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self) -> None:
        for name in ("engines", "output_lengths", "prompt_lengths", "batch_sizes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.engines:
            raise UsageError(f"no engines given: use one or more of {', '.join(ENGINE_NAMES)}")
        for engine in self.engines:
            if engine not in ENGINE_NAMES:
                raise UsageError(f"unknown engine {engine!r}: use one of {', '.join(ENGINE_NAMES)}")
        _check_unique(self.engines, "engine")
        _check_positive(self.output_lengths, "output length")
        _check_positive(self.prompt_lengths, "prompt length")
        _check_positive(self.batch_sizes, "batch size")
        if isinstance(self.runs, bool) or not isinstance(self.runs, int) or self.runs < 1:
            raise UsageError(f"runs must be at least 1, got {self.runs}")
        if isinstance(self.warmup_runs, bool) or not isinstance(self.warmup_runs, int) or self.warmup_runs < 0:
            raise UsageError(f"warm-up runs must be 0 or more, got {self.warmup_runs}")

    def bench_configs(self) -> tuple[BenchConfig, ...]:
        """Every configuration, in the order measured: engine, then batch, prompt, output length."""
        return tuple(
            BenchConfig(engine=engine, prompt_length=prompt, batch_size=batch, output_length=output,
                        warmup_runs=self.warmup_runs, runs=self.runs, seed=self.seed, sampling=self.sampling)
            for engine in self.engines
            for batch in self.batch_sizes
            for prompt in self.prompt_lengths
            for output in self.output_lengths
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GroupVerdicts:
    """The hypotheses checked on one (engine, prompt length, batch size) group."""

    engine: str
    prompt_length: int
    batch_size: int
    verdicts: tuple[hypotheses.Verdict, ...]

    @property
    def label(self) -> str:
        return f"{self.engine}, prompt {self.prompt_length}, batch {self.batch_size}"

    def to_dict(self) -> dict:
        return {"engine": self.engine, "prompt_length": self.prompt_length, "batch_size": self.batch_size,
                "verdicts": [v.to_dict() for v in self.verdicts]}


@dataclass(frozen=True)
class SweepReport:
    """What a sweep measured (every raw run, inside each result) and what it concluded."""

    config: SweepConfig
    fingerprint: dict
    results: tuple[BenchResult, ...]
    verdicts: tuple[GroupVerdicts, ...]
    folder: Path
    complete: bool  # False when interrupted: `results` holds the finished configurations
    files: tuple[Path, ...] = ()


class Progress(Protocol):
    """start(total measured runs); begin(configuration) before each; advance(runs) as they finish; close()."""

    def start(self, total: int) -> None: ...

    def begin(self, label: str) -> None: ...

    def advance(self, steps: int = 1) -> None: ...

    def close(self) -> None: ...


class NullProgress:
    """Shows nothing (tests, scripts)."""

    def start(self, total: int) -> None:
        pass

    def begin(self, label: str) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class TqdmProgress:
    """A tqdm bar on stderr over every measured run, the current configuration as its postfix."""

    def __init__(self) -> None:
        self._bar = None

    def start(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc="sweep", unit="run", file=sys.stderr, dynamic_ncols=True)

    def begin(self, label: str) -> None:
        self._bar.set_postfix_str(label)

    def advance(self, steps: int = 1) -> None:
        self._bar.update(steps)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def result_stem(config: BenchConfig) -> str:
    """``<engine>-b<B>-p<P>-n<N>``: the configuration's file name, without .json."""
    return f"{config.engine}-b{config.batch_size}-p{config.prompt_length}-n{config.output_length}"


def check_all_fit(loaded: LoadedModel, config: SweepConfig) -> None:
    """UsageError, before anything is measured, if any prompt + output length exceeds the context."""
    for prompt in config.prompt_lengths:
        check_fits(loaded, prompt, max(config.output_lengths))


def is_out_of_memory(error: BaseException) -> bool:
    """Out of memory: CUDA's error, Python's MemoryError, or a RuntimeError saying so (CPU: "can't allocate")."""
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(words in str(error) for words in ("out of memory", "can't allocate"))


def measure(loaded: LoadedModel, config: BenchConfig, bandwidth, engine, progress: Progress) -> BenchResult:
    """One configuration; running out of memory gives a failed "oom" result instead of an error."""
    finished = 0

    def on_run(index: int) -> None:
        nonlocal finished
        finished += 1
        progress.advance()

    try:
        return run_benchmark(loaded, config, bandwidth, engine=engine, on_run=on_run)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        message = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    # Outside the except block: the traceback (and the tensors its frames hold) is gone by now.
    if loaded.device.type == "cuda":
        torch.cuda.empty_cache()
    progress.advance(config.runs - finished)
    return failed_result(loaded, config, "oom", message)


def group_verdicts(results: Sequence[BenchResult]) -> tuple[GroupVerdicts, ...]:
    """The hypotheses per (engine, prompt length, batch size), on the results that ran."""
    groups: dict[tuple[str, int, int], list[BenchResult]] = {}
    for result in results:
        groups.setdefault(plots.series_key(result), [])
        if result.status == "ok":
            groups[plots.series_key(result)].append(result)
    return tuple(
        GroupVerdicts(engine, prompt, batch, hypotheses.check_all(
            [r.config.output_length for r in members], [r.runs for r in members]))
        for (engine, prompt, batch), members in groups.items()
    )


def sweep_fingerprint(loaded: LoadedModel) -> dict:
    """The machine and the model: what every configuration of the sweep shares."""
    return {**fingerprints.environment(loaded.device), "model": loaded.name, "model_source": loaded.source,
            "dtype": dtype_name(loaded.dtype), "layout": str(loaded.layout)}


def run_sweep(
    loaded: LoadedModel,
    config: SweepConfig,
    folder: Path,
    bandwidth: tuple[float | None, str] = (None, "unknown"),
    progress: Progress | None = None,
) -> SweepReport:
    """Measure every configuration, saving each as it finishes, then the summary files.

    On KeyboardInterrupt the summary files are written for the finished configurations and
    the interrupt is raised again.
    """
    progress = progress or NullProgress()
    check_all_fit(loaded, config)
    folder = Path(folder)
    try:
        (folder / "results").mkdir()
    except FileExistsError:
        raise UsageError(f"{folder} holds an earlier sweep and is kept: give each sweep a new folder") from None
    engines = {name: make_engine(name, loaded.model) for name in config.engines}
    bench_configs = config.bench_configs()
    results: list[BenchResult] = []
    interrupt = None
    progress.start(len(bench_configs) * config.runs)
    try:
        for bench_config in bench_configs:
            progress.begin(result_stem(bench_config))
            result = measure(loaded, bench_config, bandwidth, engines[bench_config.engine], progress)
            save_json_or_fallback(folder / "results" / f"{result_stem(bench_config)}.json", result.to_dict())
            results.append(result)
    except KeyboardInterrupt as error:
        interrupt = error
    finally:
        progress.close()
    report = SweepReport(config, sweep_fingerprint(loaded), tuple(results), group_verdicts(results), folder,
                         complete=interrupt is None)
    report = write_outputs(report)
    if interrupt is not None:
        raise interrupt
    return report


def write_outputs(report: SweepReport) -> SweepReport:
    """sweep.json, sweep.csv, sweep.md and the plots, each new and written atomically."""
    folder = report.folder
    files = [
        write_json_atomic(folder / "sweep.json", sweep_dict(report)),
        write_text_atomic(folder / "sweep.csv", csv_text(report.results)),
        write_text_atomic(folder / "sweep.md", markdown_text(report)),
    ]
    files += plots.write_plots(report.results, folder, title(report.fingerprint))
    return replace(report, files=tuple(files))


def sweep_dict(report: SweepReport) -> dict:
    return {
        "schema": SCHEMA,
        "complete": report.complete,
        "config": report.config.to_dict(),
        "fingerprint": report.fingerprint,
        "results": [r.to_dict() for r in report.results],
        "hypotheses": [g.to_dict() for g in report.verdicts],
    }
