"""The output-length experiment: every (engine, batch, prompt, output length), saved as it finishes.

A run folder (made new by `storage.new_run_folder`, so nothing earlier is overwritten) gets:

- ``results/<engine>-b<B>-p<P>-n<N>.json``: each configuration's `BenchResult`, written when
  it finishes, so an interrupt keeps it;
- ``sweep.json`` (schema ``inferlab.sweep/1``: config, fingerprint, every result, verdicts),
  written at the end, or for the finished configurations when the sweep is interrupted; the
  caller's `write` adds the rendered files (the CLI passes `inferlab.look.sweep_files.write_outputs`:
  ``sweep.csv``, ``sweep.md``, the four PNG plots and ``sweep.html``).

Order (``SweepConfig.order``). ``interleaved`` (the default): every configuration is first
prepared and warmed up, then the measured runs go in rounds; each round visits every
configuration once, in an order shuffled anew each round by a generator seeded with
``SweepConfig.seed``. Drift of the host during the sweep (clocks, caches, other load) is then
spread over all configurations instead of being loaded onto the last ones, where it would read
as an effect of output length. ``sequential`` measures each configuration's runs back to back,
one configuration after another. Every run's round, position in its round and start time
(seconds since the first measured run) go into the JSON beside its raw timestamps
(``schedule``), so drift can be seen.

Top-up (``SweepConfig.max_runs`` above ``runs``, interleaved order only; `inferlab.suite.top_up`
has the stop rule): after the base rounds each group (engine, prompt length, batch size) is
judged on its runs so far, and while some group has an INCONCLUSIVE verdict, fewer than
``max_runs`` runs per configuration and ``top_up_s`` seconds left for one more round, one more
round measures the undecided groups' configurations. Its order continues the base rounds'
generator: each top-up round shuffles the indices of the configurations it measures, in
ascending order, with the same ``random.Random(seed)`` (`measurement_order` with ``top_up_rounds``
gives it back). Round indices go on from ``runs``. A configuration is finished (costs, profile)
and its result file written once, when its group stops; sweep.json's ``top_up`` says how many
rounds each group got and why it stopped.

Each engine is built once for the whole sweep, and a configuration is prepared once (the fast
engine keeps every prepared shape), so a compiling engine compiles once per shape; the time its
`prepare` takes is in that result's ``prepare_ms``. A configuration that runs out of device
memory becomes an "oom" row and the sweep goes on. On Ctrl-C, each configuration keeps the runs
it has measured (fewer than asked where its rounds were not all done).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from inferlab.measure import energy
from inferlab.measure import fingerprint as fingerprints
from inferlab.suite import hypotheses, top_up
from inferlab.suite.progress import NullProgress, Progress
from inferlab.suite.schedule import ORDERS, ScheduledRun, Slot, base_rounds, measurement_order, round_slots
from inferlab.measure.bench import (SPLIT_ENGINES, BenchConfig, BenchResult, Costs, PreparedCase, measure_costs, check_fits, failed_result,
                                    prepare_case)
from inferlab.measure.metrics import RunTimes
from inferlab.model.devices import dtype_name
from inferlab.decode.engines import ENGINE_NAMES, make_engine
from inferlab.errors import UsageError, first_line
from inferlab.model.registry import LoadedModel
from inferlab.decode.sampling import SamplingConfig
from inferlab.storage import save_json_or_fallback, write_json_atomic

SCHEMA = "inferlab.sweep/1"
DEFAULT_TOP_UP_S = 180.0  # for all top-up rounds: 7 more rounds of the CPU main job at TPOT 33 ms, 4 at 60 ms
CUDA_ENGINES = ("eager", "hf", "fast")  # the engines users choose between
CPU_ENGINES = ("eager",)  # keeps the CPU sweep to minutes


def default_engines(device: torch.device, split: bool = False) -> tuple[str, ...]:
    """The engines a sweep compares unless told: eager, hf and fast on CUDA, eager on the CPU;
    only those that run a model split across devices when `split`."""
    engines = CUDA_ENGINES if device.type == "cuda" else CPU_ENGINES
    return tuple(e for e in engines if e in SPLIT_ENGINES) if split else engines


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
    warmup_runs: int = 1
    runs: int = 5
    seed: int = 0  # the prompts', the sampler's and the interleaved order's
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    order: str = "interleaved"  # or "sequential" (see the module's docstring)
    inject_delay_per_position_us: float = 0.0  # a known violation (inferlab.measure.inject); 0: off
    max_runs: int = 0  # top-up: up to this many runs per configuration while its group is undecided; 0: `runs` exactly
    top_up_s: float = DEFAULT_TOP_UP_S  # wall-clock seconds for all top-up rounds together

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
        if self.order not in ORDERS:
            raise UsageError(f"unknown order {self.order!r}: use {' or '.join(ORDERS)}")
        if not self.inject_delay_per_position_us >= 0:
            raise UsageError(f"the injected delay per position must be >= 0 us, got {self.inject_delay_per_position_us}")
        if (isinstance(self.max_runs, bool) or not isinstance(self.max_runs, int)
                or self.max_runs != 0 and self.max_runs < self.runs):
            raise UsageError(f"max runs must be 0 (no top-up) or at least runs ({self.runs}), got {self.max_runs}")
        if isinstance(self.top_up_s, bool) or not isinstance(self.top_up_s, (int, float)) or not (
                math.isfinite(self.top_up_s) and self.top_up_s >= 0):
            raise UsageError(f"the top-up budget must be a finite number of seconds >= 0, got {self.top_up_s}")
        if self.tops_up and self.order == "sequential":
            raise UsageError(f"max runs {self.max_runs} above runs {self.runs} tops up in interleaved rounds: "
                             "use order interleaved, or max runs 0 with order sequential")

    @property
    def tops_up(self) -> bool:
        """Whether undecided groups get top-up rounds after the base rounds."""
        return self.max_runs > self.runs

    def bench_configs(self) -> tuple[BenchConfig, ...]:
        """Every configuration: engine, then batch, prompt, output length (the sequential order)."""
        return tuple(
            BenchConfig(engine=engine, prompt_length=prompt, batch_size=batch, output_length=output,
                        warmup_runs=self.warmup_runs, runs=self.runs, seed=self.seed, sampling=self.sampling,
                        inject_delay_per_position_us=self.inject_delay_per_position_us)
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
    complete: bool  # False when interrupted: `results` holds what was measured (some with fewer runs)
    files: tuple[Path, ...] = ()
    schedules: dict = field(default_factory=dict)  # result_stem -> tuple[ScheduledRun], one per run
    top_up_groups: tuple[top_up.GroupTopUp, ...] = ()  # one per group when `config.tops_up`
    top_up_rounds: tuple[tuple[str, ...], ...] = ()  # each top-up round's result stems, in the order measured


def result_stem(config: BenchConfig) -> str:
    """``<engine>-b<B>-p<P>-n<N>``: the configuration's file name, without .json."""
    return f"{config.engine}-b{config.batch_size}-p{config.prompt_length}-n{config.output_length}"


GroupKey = tuple[str, int, int]  # (engine, prompt length, batch size): what one group of output lengths holds fixed


def config_key(config: BenchConfig) -> GroupKey:
    return config.engine, config.prompt_length, config.batch_size


def groups_of(configs: Sequence[BenchConfig]) -> dict[GroupKey, tuple[int, ...]]:
    """Each group's configurations (indices into `configs`), groups in the order they first appear."""
    groups: dict[GroupKey, list[int]] = {}
    for index, config in enumerate(configs):
        groups.setdefault(config_key(config), []).append(index)
    return {key: tuple(indices) for key, indices in groups.items()}


def check_all_fit(loaded: LoadedModel, config: SweepConfig) -> None:
    """UsageError, before anything is measured, if any prompt + output length exceeds the context."""
    for prompt in config.prompt_lengths:
        check_fits(loaded, prompt, max(config.output_lengths))


def is_out_of_memory(error: BaseException) -> bool:
    """Out of memory: CUDA's error, Python's MemoryError, or a RuntimeError saying so (CPU: "can't allocate")."""
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(words in str(error) for words in ("out of memory", "can't allocate"))


class _Measurement:
    """The sweep's state while it runs: each configuration's prepared case, runs and schedule."""

    def __init__(self, loaded: LoadedModel, config: SweepConfig, bandwidth, engines: dict, folder: Path,
                 progress: Progress, meter=None, profile: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.loaded, self.config, self.bandwidth, self.engines = loaded, config, bandwidth, engines
        self.folder, self.progress = folder, progress
        self.meter, self.profile, self.clock = meter, profile, clock
        self.costs: dict[int, Costs] = {}
        self.profiles: dict[int, object] = {}
        self.bench_configs = config.bench_configs()
        self.cases: dict[int, PreparedCase] = {}
        self.failed: dict[int, BenchResult] = {}
        self.runs: dict[int, list[RunTimes]] = {i: [] for i in range(len(self.bench_configs))}
        self.schedule: dict[int, list[ScheduledRun]] = {i: [] for i in range(len(self.bench_configs))}
        self.planned = {i: config.runs for i in range(len(self.bench_configs))}  # runs counted in the progress total
        self.last_run_s: dict[int, float] = {}  # each configuration's latest measured run, wall-clock seconds
        self.saved: set[int] = set()
        self.t0: float | None = None
        self.groups = groups_of(self.bench_configs)
        self.top_up_rounds: dict[GroupKey, int] = {key: 0 for key in self.groups}
        self.stopped: dict[GroupKey, str] = {}
        self.top_up_order: list[tuple[int, ...]] = []

    def prepare(self, index: int) -> None:
        """Prepare and warm up configuration `index` (once); out of memory makes it an "oom" row."""
        if index in self.cases or index in self.failed:
            return
        bench_config = self.bench_configs[index]
        self.progress.begin(result_stem(bench_config))
        try:
            case = prepare_case(self.loaded, bench_config, self.bandwidth, self.engines[bench_config.engine])
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            message = first_line(error)[:300]
        else:
            self.cases[index] = case
            return
        self._fail(index, message)

    def measure(self, slot: Slot) -> None:
        """One measured run of `slot`'s configuration; its result is saved once its last run is in."""
        index = slot.config
        self.prepare(index)
        if index in self.failed:
            return
        self.progress.begin(result_stem(self.bench_configs[index]))
        now = self.clock()
        self.t0 = now if self.t0 is None else self.t0
        start_s = now - self.t0
        try:
            run = self.cases[index].measure_one()
        except (RuntimeError, MemoryError) as error:
            if not is_out_of_memory(error):
                raise
            message = first_line(error)[:300]
        else:
            self.last_run_s[index] = self.clock() - now
            self.runs[index].append(run)
            self.schedule[index].append(ScheduledRun(slot.round, slot.position, start_s))
            self.progress.advance()
            if not self.config.tops_up and len(self.runs[index]) == self.config.runs:
                self.finish(index)
                self.save(index)
            return
        self._fail(index, message)

    def finish(self, index: int) -> None:
        """After a configuration's last timed run: what its requests cost, and its profile if asked for."""
        case = self.cases[index]
        self.costs[index] = measure_costs(case, self.meter)
        if self.profile:
            stem = result_stem(self.bench_configs[index])
            self.profiles[index] = case.profile(self.folder / "profiles" / f"{stem}.trace.json")

    def _fail(self, index: int, message: str) -> None:
        """Make configuration `index` an "oom" row. Called after the except block has ended, so the
        traceback (and the tensors its frames hold) is gone before the cache is emptied."""
        self.cases.pop(index, None)
        if self.loaded.device.type == "cuda":
            torch.cuda.empty_cache()
        self.progress.advance(self.planned[index] - len(self.runs[index]))
        self.runs[index], self.schedule[index] = [], []
        self.failed[index] = failed_result(self.loaded, self.bench_configs[index], "oom", message)
        self.save(index)

    def result(self, index: int) -> BenchResult | None:
        if index in self.failed:
            return self.failed[index]
        if not self.runs[index]:
            return None
        return self.cases[index].result(self.runs[index], self.costs.get(index), self.profiles.get(index))

    def save(self, index: int) -> None:
        assert index not in self.saved, f"{result_stem(self.bench_configs[index])} is saved once, when final"
        self.saved.add(index)
        stem = result_stem(self.bench_configs[index])
        data = {**self.result(index).to_dict(), "schedule": [s.to_dict() for s in self.schedule[index]]}
        save_json_or_fallback(self.folder / "results" / f"{stem}.json", data)

    def save_unfinished(self) -> None:
        """After an interrupt: each configuration with some runs not saved yet, as it stands."""
        for index, runs in self.runs.items():
            if runs and index not in self.saved:
                self.save(index)

    # ------------------------------------------------------------------------- top-up

    def verdicts_so_far(self) -> dict[GroupKey, tuple[hypotheses.Verdict, ...]]:
        """`group_verdicts` on the runs measured so far, by group."""
        groups: dict[GroupKey, Members] = {}
        for key, indices in self.groups.items():
            groups[key] = [Member(self.bench_configs[i].output_length, self.runs[i],
                                  self.cases[i].decode_roofline().bytes_per_step,
                                  run_rounds(self.config.order, [run.round for run in self.schedule[i]]))
                           for i in indices if i in self.cases and self.runs[i]]
        return {key: judged.verdicts for key, judged in zip(groups, _judged(groups))}

    def stop(self, key: GroupKey, reason: str) -> None:
        """Group `key` gets no more runs: each of its measured configurations is finished and saved."""
        self.stopped[key] = reason
        for index in self.groups[key]:
            if index in self.cases and self.runs[index] and index not in self.saved:
                self.finish(index)
                self.save(index)

    def still_short(self, key: GroupKey) -> tuple[int, ...]:
        """The group's configurations still measured and below `max_runs` runs."""
        return tuple(i for i in self.groups[key] if i in self.cases and len(self.runs[i]) < self.config.max_runs)

    def measure_round(self, slots: Sequence[Slot], keys: Sequence[GroupKey]) -> None:
        """One top-up round of the groups `keys`: `slots`, counted in the progress first."""
        self.top_up_order.append(tuple(slot.config for slot in slots))
        for key in keys:
            self.top_up_rounds[key] += 1
        for slot in slots:
            self.planned[slot.config] += 1
        self.progress.grow(len(slots))
        for slot in slots:
            self.measure(slot)

    def top_up_record(self) -> tuple[tuple[top_up.GroupTopUp, ...], tuple[tuple[str, ...], ...]]:
        """Each group's top-up (a group not stopped was interrupted), and each round's stems in the order measured."""
        groups = tuple(top_up.GroupTopUp(*key, self.top_up_rounds[key], self.stopped.get(key, top_up.INTERRUPTED))
                       for key in self.groups)
        rounds = tuple(tuple(result_stem(self.bench_configs[i]) for i in order) for order in self.top_up_order)
        return groups, rounds

    def results(self) -> tuple[tuple[BenchResult, ...], dict]:
        """Results in the configurations' order, and their schedules by result stem."""
        results, schedules = [], {}
        for index in range(len(self.bench_configs)):
            result = self.result(index)
            if result is not None:
                results.append(result)
                schedules[result_stem(result.config)] = tuple(self.schedule[index])
        return tuple(results), schedules


def series_key(result: BenchResult) -> tuple[str, int, int]:
    """(engine, prompt length, batch size): what one group of output lengths holds fixed."""
    return result.config.engine, result.prompt_length, result.config.batch_size


class Member(NamedTuple):
    """One output length of a group, as the hypotheses judge it."""

    output_length: int
    runs: Sequence[RunTimes]
    bytes_per_step: Optional[float]  # None without a roofline
    rounds: Optional[tuple[int, ...]]  # each run's round where the sweep pairs them (`run_rounds`), else None


Members = list[Member]


def run_rounds(order: str, rounds: Sequence[int]) -> tuple[int, ...] | None:
    """The rounds of a configuration's runs, in an interleaved sweep, for the hypotheses to pair the
    runs by round; None in the sequential order, whose "rounds" are not time-adjacent."""
    return tuple(rounds) if order == "interleaved" else None


def run_top_up(state: _Measurement, shuffler: random.Random) -> None:
    """Rounds after the base rounds, over the undecided groups' configurations, until every group
    has stopped (`inferlab.suite.top_up`); round indices go on from the base rounds'."""
    config = state.config
    spent_s, round_index = 0.0, config.runs
    while True:
        verdicts = state.verdicts_so_far()
        going = []
        for key in state.groups:
            if key in state.stopped:
                continue
            if not top_up.is_undecided(verdicts[key]):
                state.stop(key, top_up.DECIDED)
            elif not state.still_short(key):
                state.stop(key, top_up.MAX_RUNS)
            else:
                going.append(key)
        if not going:
            return
        configs = sorted(i for key in going for i in state.still_short(key))
        if not top_up.fits_budget(spent_s, sum(state.last_run_s[i] for i in configs), config.top_up_s):
            for key in going:
                state.stop(key, top_up.BUDGET)
            return
        began = state.clock()
        state.measure_round(round_slots(shuffler, configs, round_index), going)
        spent_s += state.clock() - began
        round_index += 1


def _judged(groups: dict[tuple[str, int, int], Members]) -> tuple[GroupVerdicts, ...]:
    verdicts = []
    for (engine, prompt, batch), members in groups.items():
        per_step = None if any(m.bytes_per_step is None for m in members) else [m.bytes_per_step for m in members]
        rounds = None if any(m.rounds is None for m in members) else [m.rounds for m in members]
        verdicts.append(GroupVerdicts(engine, prompt, batch, hypotheses.check_all(
            [m.output_length for m in members], [m.runs for m in members], per_step, rounds=rounds)))
    return tuple(verdicts)


def group_verdicts(results: Sequence[BenchResult], schedules: dict | None = None,
                   order: str = "interleaved") -> tuple[GroupVerdicts, ...]:
    """The hypotheses per (engine, prompt length, batch size), on the results that ran; `schedules`
    (result stem -> its runs' `ScheduledRun`s) pairs them by round in the interleaved `order`."""
    groups: dict[tuple[str, int, int], Members] = {}
    for result in results:
        members = groups.setdefault(series_key(result), [])
        if result.status == "ok":
            schedule = None if schedules is None else schedules.get(result_stem(result.config))
            members.append(Member(result.config.output_length, result.runs,
                                  None if result.roofline is None else result.roofline.bytes_per_step,
                                  None if schedule is None else run_rounds(order, [run.round for run in schedule])))
    return _judged(groups)


def saved_group_verdicts(saved: dict) -> tuple[GroupVerdicts, ...]:
    """`group_verdicts` on a saved sweep.json (its raw runs), judged by this version's rules."""
    groups: dict[tuple[str, int, int], Members] = {}
    for result in saved["results"]:
        config = result["config"]
        members = groups.setdefault((config["engine"], result["prompt_length"], config["batch_size"]), [])
        if result.get("status") == "ok":
            roofline = result.get("roofline")
            schedule = result.get("schedule")
            members.append(Member(config["output_length"], [RunTimes(tuple(run["token_ms"])) for run in result["runs"]],
                                  None if roofline is None else roofline["bytes_per_step"],
                                  None if schedule is None else run_rounds(saved.get("config", {}).get("order", ""),
                                                                            [run["round"] for run in schedule])))
    return _judged(groups)


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
    profile: bool = False,
    write: Callable[[SweepReport], SweepReport] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> SweepReport:
    """Measure every configuration, saving each as it finishes, then the summary files: sweep.json,
    and whatever `write` (report -> report with its files) adds; None: sweep.json alone.

    With `profile`, each configuration also writes ``profiles/<stem>.trace.json`` (after its timed runs).
    `clock` (seconds) times the schedule and the top-up's budget.

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
    meter = energy.open_meter(loaded.output_device)  # once: it measures the counter's update interval
    if profile:
        (folder / "profiles").mkdir()
    state = _Measurement(loaded, config, bandwidth, engines, folder, progress, meter, profile, clock)
    shuffler = random.Random(config.seed)  # the interleaved order's, base rounds then top-up rounds
    count = len(state.bench_configs)
    slots = (base_rounds(shuffler, count, config.runs) if config.order == "interleaved"
             else measurement_order(count, config.runs, config.order, config.seed))
    interrupt = None
    progress.start(len(slots))
    try:
        if config.order == "interleaved":  # warm-ups first, every configuration, before any measured run
            for index in range(count):
                state.prepare(index)
        for slot in slots:
            state.measure(slot)
        if config.tops_up:
            run_top_up(state, shuffler)
    except KeyboardInterrupt as error:
        interrupt = error
        state.save_unfinished()
    finally:
        progress.close()
    results, schedules = state.results()
    groups, rounds = state.top_up_record() if config.tops_up else ((), ())
    report = SweepReport(config, sweep_fingerprint(loaded), results, group_verdicts(results, schedules, config.order), folder,
                         complete=interrupt is None, schedules=schedules, top_up_groups=groups, top_up_rounds=rounds)
    report = (write or write_json)(report)
    if interrupt is not None:
        raise interrupt
    return report


def write_json(report: SweepReport) -> SweepReport:
    """sweep.json, new and written atomically."""
    return replace(report, files=(write_json_atomic(report.folder / "sweep.json", sweep_dict(report)),))


def sweep_dict(report: SweepReport) -> dict:
    return {
        "schema": SCHEMA,
        "complete": report.complete,
        "config": report.config.to_dict(),
        "fingerprint": report.fingerprint,
        "results": [{**r.to_dict(), "schedule": [s.to_dict() for s in report.schedules.get(result_stem(r.config), ())]}
                    for r in report.results],
        "hypotheses": [g.to_dict() for g in report.verdicts],
        "top_up": top_up_dict(report),
    }


def top_up_dict(report: SweepReport) -> dict | None:
    """sweep.json's record of the top-up: each group's rounds and why they stopped, each round's order; None when off."""
    if not report.config.tops_up:
        return None
    first = report.config.runs
    return {"groups": [g.to_dict() for g in report.top_up_groups],
            "rounds": [{"round": first + r, "order": list(stems)} for r, stems in enumerate(report.top_up_rounds)],
            "shuffled_by": "random.Random(seed), continued after the base rounds; each round shuffles its "
                           "configurations in the configurations' order"}
