"""One benchmark configuration: warm up, measure repeated runs, keep every raw timestamp."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from inferlab.measure import energy, fingerprint, inject, memory, profiling
from inferlab.measure import roofline
from inferlab.decode.loop import DecodeConfig
from inferlab.decode.engines import ENGINE_NAMES, make_engine
from inferlab.errors import UsageError
from inferlab.model.fit import check_memory
from inferlab.measure.metrics import RunTimes, summarize
from inferlab.model.registry import LoadedModel
from inferlab.decode.prompts import Prompt, from_ids, encode_texts, random_prompt
from inferlab.decode.sampling import SamplingConfig
from inferlab.measure.clocks import clock_for, synchronize

SCHEMA = "inferlab.bench/1"


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark measures. The output length is fixed: EOS is ignored."""

    engine: str = "eager"
    prompt_length: int = 128
    prompt_text: str | None = None
    batch_size: int = 1
    output_length: int = 128
    warmup_runs: int = 2
    runs: int = 5
    seed: int = 0
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    per_token_events: bool = True
    # A known violation for testing the verdicts (`inferlab.measure.inject`); 0 (off) unless asked.
    inject_delay_per_position_us: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prompt_length", "batch_size", "output_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UsageError(f"{name.replace('_', ' ')} must be a positive integer, got {value}")
        if not self.inject_delay_per_position_us >= 0:
            raise UsageError(f"the injected delay per position must be >= 0 us, got {self.inject_delay_per_position_us}")
        if self.runs < 1:
            raise UsageError(f"runs must be at least 1, got {self.runs}")
        if self.warmup_runs < 0:
            raise UsageError(f"warm-up runs must be 0 or more, got {self.warmup_runs}")
        if self.engine not in ENGINE_NAMES:
            raise UsageError(f"unknown engine {self.engine!r}: use one of {', '.join(ENGINE_NAMES)}")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sampling"] = asdict(self.sampling)
        return out


@dataclass(frozen=True)
class BenchResult:
    """A measured configuration: raw runs plus what they ran on; statistics are derived."""

    config: BenchConfig
    fingerprint: dict
    runs: tuple[RunTimes, ...]
    warmup_e2e_ms: tuple[float, ...]
    prepare_ms: float
    roofline: roofline.Roofline | None
    prompt_length: int  # the actual prompt length (a text prompt's token count)
    status: str = "ok"  # "ok", "oom" or "error"
    error: str | None = None
    memory: memory.MemoryUsage | None = None
    energy: energy.EnergyReading | energy.Unavailable | None = None
    profile: profiling.ProfileSummary | None = None

    @property
    def summary(self) -> dict:
        return summarize(list(self.runs), self.config.batch_size) if self.runs else {}

    def roofline_summary(self) -> dict | None:
        if self.roofline is None or not self.runs or not self.summary.get("tpot_ms"):
            return None
        return {**self.roofline.to_dict(), **self.roofline.achieved(self.summary["tpot_ms"]["p50"])}

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "status": self.status,
            "error": self.error,
            "config": self.config.to_dict(),
            "fingerprint": self.fingerprint,
            "prompt_length": self.prompt_length,
            "prepare_ms": self.prepare_ms,
            "warmup_e2e_ms": list(self.warmup_e2e_ms),
            "runs": [{"token_ms": list(r.token_ms), "wall_ms": r.wall_ms} for r in self.runs],
            "summary": self.summary,
            "roofline": self.roofline_summary(),
            "memory": None if self.memory is None else self.memory.to_dict(),
            "energy": None if self.energy is None else self.energy.to_dict(),
            "profile": None if self.profile is None else self.profile.to_dict(),
        }


def result_from_dict(data: dict) -> BenchResult:
    """Rebuild a result saved by `BenchResult.to_dict` (statistics are recomputed from the raw runs)."""
    if data.get("schema") != SCHEMA:
        raise UsageError(f"not an inferlab benchmark result (schema {data.get('schema')!r}, expected {SCHEMA!r})")
    config = dict(data["config"])
    config["sampling"] = SamplingConfig(**config["sampling"])
    line = data.get("roofline")
    saved_roofline = None
    if line:
        bandwidth = line["bandwidth_gb_per_s"] * 1e9 if line["bandwidth_gb_per_s"] is not None else None
        saved_roofline = roofline.Roofline(line["weight_bytes_per_step"], line["kv_bytes_per_step"], bandwidth, line["bandwidth_source"])
    return BenchResult(
        config=BenchConfig(**config),
        fingerprint=data["fingerprint"],
        runs=tuple(RunTimes(tuple(r["token_ms"]), r.get("wall_ms")) for r in data["runs"]),
        warmup_e2e_ms=tuple(data.get("warmup_e2e_ms", ())),
        prepare_ms=data.get("prepare_ms", 0.0),
        roofline=saved_roofline,
        prompt_length=data["prompt_length"],
        status=data.get("status", "ok"),
        error=data.get("error"),
        memory=memory.memory_from_dict(data.get("memory")),
        energy=energy.energy_from_dict(data.get("energy")),
        profile=profiling.summary_from_dict(data.get("profile")),
    )


def build_prompt(loaded: LoadedModel, config: BenchConfig) -> Prompt:
    """The benchmark's prompt: a text (repeated over the batch) or seeded random ids."""
    device = loaded.device
    if config.prompt_text is not None:
        row = encode_texts(loaded.tokenizer, [config.prompt_text])[0]
        return from_ids([row] * config.batch_size, loaded.tokenizer.pad_token_id, device)
    generator = torch.Generator().manual_seed(config.seed)
    return random_prompt(loaded.model.config.vocab_size, config.prompt_length, config.batch_size, generator, device)


def check_fits(loaded: LoadedModel, prompt_length: int, output_length: int) -> None:
    """UsageError when prompt + output exceed the model's context."""
    if prompt_length + output_length > loaded.max_context:
        raise UsageError(
            f"prompt ({prompt_length}) + output ({output_length}) tokens exceed {loaded.name}'s context of "
            f"{loaded.max_context}: shorten the prompt or the output"
        )


def decode_config(loaded: LoadedModel, config: BenchConfig) -> DecodeConfig:
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer is not None else 0
    return DecodeConfig(config.output_length, config.sampling, ignore_eos=True, pad_token_id=pad)


def run_once(engine, prompt: Prompt, decode: DecodeConfig, generator, clock, device: torch.device) -> RunTimes:
    """One timed request: event (or host) timestamps per token, and a synchronized wall clock around it."""
    synchronize(device)
    wall_start = time.perf_counter()
    engine.run(prompt, decode, generator, clock)
    token_ms = clock.finish()  # synchronizes once
    wall_ms = (time.perf_counter() - wall_start) * 1e3
    return RunTimes(token_ms=token_ms, wall_ms=wall_ms)


@dataclass
class PreparedCase:
    """One configuration ready to measure: engine prepared, warm-ups run; `measure_one` times a request.

    Holds its own prompt, generator and clock, so several configurations can be measured in any
    interleaving and each sees the same requests and random draws as when measured alone.
    """

    loaded: LoadedModel
    config: BenchConfig
    bandwidth: tuple[float | None, str]
    engine: object
    prompt: Prompt
    decode: DecodeConfig
    generator: torch.Generator
    clock: object
    timed: torch.device
    prepare_ms: float
    warmup_e2e_ms: tuple[float, ...] = ()

    def measure_one(self) -> RunTimes:
        return run_once(self.engine, self.prompt, self.decode, self.generator, self.clock, self.timed)

    def decode_roofline(self) -> roofline.Roofline:
        """What a decode step of this request reads, against the device's bandwidth."""
        loaded, prompt = self.loaded, self.prompt
        return roofline.roofline(loaded.model, prompt.batch_size, prompt.length, self.config.output_length,
                                 layout_bandwidth(self.bandwidth, loaded.layout))

    def result(self, runs: Sequence[RunTimes], costs: Costs | None = None,
               profile: profiling.ProfileSummary | None = None) -> BenchResult:
        """The BenchResult of the measured `runs` (every raw timestamp kept), with what they cost."""
        loaded, config, prompt = self.loaded, self.config, self.prompt
        return BenchResult(
            config=config,
            fingerprint=make_fingerprint(loaded, config, prompt.length),
            runs=tuple(runs),
            warmup_e2e_ms=self.warmup_e2e_ms,
            prepare_ms=self.prepare_ms,
            roofline=self.decode_roofline(),
            prompt_length=prompt.length,
            memory=None if costs is None else costs.memory,
            energy=None if costs is None else costs.energy,
            profile=profile,
        )

    def profile(self, trace_path: Path) -> profiling.ProfileSummary:
        """One more request under the profiler, after the timed runs; its trace written to `trace_path`."""
        return profiling.profile_request(self.engine, self.prompt, self.decode, self.generator, self.clock,
                                         self.timed, trace_path)


@dataclass(frozen=True)
class Costs:
    """What serving a configuration's requests took: memory, and energy per output token."""

    memory: memory.MemoryUsage
    energy: energy.EnergyReading | energy.Unavailable


# The energy counter is read around a contiguous block of requests at least this long, and at least
# COST_SPAN_UPDATES of the counter's update intervals: each end of a span is uncertain by one update.
COST_SPAN_S = 2.0
COST_SPAN_UPDATES = 20


def measure_costs(case: PreparedCase, meter, clock: Callable[[], float] = time.perf_counter) -> Costs:
    """Memory peaks and energy over a block of back-to-back requests of `case`, apart from the timed runs.

    The timed runs may be interleaved with other configurations, so neither the device's memory peak
    nor the energy counter can be attributed to one configuration over them. On a GPU the block
    resets the peaks, then repeats the request until COST_SPAN_S (or COST_SPAN_UPDATES counter
    updates) have passed. Without a GPU and a meter there is nothing to reset or read: no extra
    request runs, and the process's peak resident memory is what is reported.
    """
    device, batch = case.timed, case.prompt.batch_size
    metered = not isinstance(meter, energy.Unavailable)
    if device.type != "cuda" and not metered:
        return Costs(_usage(case), meter)
    span_s = max(COST_SPAN_S, COST_SPAN_UPDATES * (meter.update_interval_s or 0.0) if metered else 0.0)
    memory.reset_peaks(device)
    started = meter.start() if metered else None
    began, requests = clock(), 0
    while requests == 0 or clock() - began < span_s:
        case.measure_one()  # synchronizes at its end: the counter is read after the work is done
        requests += 1
    used = meter.stop(started, requests * batch * case.config.output_length) if metered else meter
    return Costs(_usage(case), used)


def unmeasured_costs(case: PreparedCase, reason: str) -> Costs:
    """No block of extra requests: the memory peaks so far (the whole process's, not this case's alone)
    and no energy figure, with `reason`."""
    return Costs(_usage(case), energy.Unavailable(reason))


def _usage(case: PreparedCase) -> memory.MemoryUsage:
    """The memory figures of `case` read now: device peaks since the last reset, weights, its KV cache."""
    final_length = case.prompt.length + case.config.output_length
    return memory.measure_usage(case.loaded.model, case.timed, case.prompt.batch_size, final_length)


def prepare_case(
    loaded: LoadedModel,
    config: BenchConfig,
    bandwidth: tuple[float | None, str] = (None, "unknown"),
    engine=None,
) -> PreparedCase:
    """Build the prompt, prepare the engine for it (timed, never in TPOT) and run the warm-ups."""
    if config.prompt_text is None:  # before the prompt itself is allocated
        check_memory(loaded, config.batch_size, config.prompt_length, config.output_length)
    prompt = build_prompt(loaded, config)
    check_fits(loaded, prompt.length, config.output_length)
    check_memory(loaded, prompt.batch_size, prompt.length, config.output_length)
    device = loaded.device
    decode = decode_config(loaded, config)
    generator = torch.Generator(device=device).manual_seed(config.seed)

    check_engine_layout(config.engine, loaded.layout)
    prepare_start = time.perf_counter()
    engine = engine or make_engine(config.engine, loaded.model)
    engine.prepare(prompt, decode)  # compilation and graph capture: timed here, never in TPOT
    synchronize(device)
    prepare_ms = (time.perf_counter() - prepare_start) * 1e3

    timed = loaded.output_device  # each step ends at the LM head: on the last GPU of a pipeline
    clock = clock_for(timed, config.output_length, config.per_token_events)
    if config.inject_delay_per_position_us > 0:
        clock = inject.PositionDelayClock(clock, config.inject_delay_per_position_us, prompt.length,
                                          inject.where_to_inject(engine, timed), timed)
    case = PreparedCase(loaded, config, bandwidth, engine, prompt, decode, generator, clock, timed, prepare_ms)
    case.warmup_e2e_ms = tuple(case.measure_one().e2e_ms for _ in range(config.warmup_runs))
    return case


def repeat_within_budget(measure_one: Callable[[], RunTimes], rounds: int, budget_s: float, min_rounds: int,
                         clock: Callable[[], float] = time.perf_counter) -> list[RunTimes]:
    """Measured requests: `rounds` of them, or fewer once they have taken `budget_s` seconds of
    `clock` in all, but never fewer than `min_rounds` (nor more than `rounds`); `budget_s` <= 0: no budget."""
    runs: list[RunTimes] = []
    start = clock()
    while len(runs) < rounds:
        runs.append(measure_one())
        if budget_s > 0 and len(runs) >= min_rounds and clock() - start >= budget_s:
            break
    return runs


def run_benchmark(
    loaded: LoadedModel,
    config: BenchConfig,
    bandwidth: tuple[float | None, str] = (None, "unknown"),
    engine=None,
    on_run=None,
    energy_meter=None,
    profile_trace: Path | None = None,
) -> BenchResult:
    """Warm up, then time `config.runs` requests; return every raw timestamp.

    Then what they cost (`measure_costs`; `energy_meter` as from `energy.open_meter`, opened here
    when not given) and, with `profile_trace`, one more request under the profiler, its trace
    written to that new file. Neither enters the timed runs.
    """
    case = prepare_case(loaded, config, bandwidth, engine)
    runs = []
    for index in range(config.runs):
        runs.append(case.measure_one())
        if on_run is not None:
            on_run(index)
    meter = energy_meter if energy_meter is not None else energy.open_meter(case.timed)
    costs = measure_costs(case, meter)
    profile = case.profile(profile_trace) if profile_trace is not None else None
    return case.result(runs, costs, profile)


SPLIT_ENGINES = ("eager", "hf", "hf-static")


def layout_bandwidth(bandwidth: tuple[float | None, str], layout) -> tuple[float | None, str]:
    """The bandwidth a step can use: N GPUs read their shards at once under tensor parallelism;
    a pipeline's GPUs take their turns within a step, so one GPU's bandwidth bounds it."""
    value, source = bandwidth
    if layout.kind != "tp" or value is None:
        return bandwidth
    return value * layout.devices, f"{source} x {layout.devices} GPUs"


def check_engine_layout(engine: str, layout) -> None:
    """UsageError for an engine that cannot run a model split across devices."""
    if layout.kind != "single" and engine not in SPLIT_ENGINES:
        raise UsageError(f"engine {engine!r} runs on one device; with --layout {layout} use {', '.join(SPLIT_ENGINES)}")


def make_fingerprint(loaded: LoadedModel, config: BenchConfig, prompt_length: int) -> dict:
    """The environment plus what was measured: model, dtype, engine and the shape of the request."""
    from inferlab.model.devices import dtype_name

    return {
        **fingerprint.environment(loaded.device),
        "model": loaded.name,
        "model_source": loaded.source,
        "dtype": dtype_name(loaded.dtype),
        "engine": config.engine,
        "prompt_length": prompt_length,
        "batch_size": config.batch_size,
        "output_length": config.output_length,
        "layout": str(loaded.layout),
        "layout_devices": loaded.layout.devices,
    }


def failed_result(loaded: LoadedModel, config: BenchConfig, status: str, message: str) -> BenchResult:
    """A row for a configuration that could not run (out of memory, say), so a sweep can go on."""
    return BenchResult(config, make_fingerprint(loaded, config, config.prompt_length), (), (), 0.0, None,
                       config.prompt_length, status=status, error=message)
