"""pytest plugin: decode benchmarks under pytest-benchmark, timed by CUDA events.

- The `gpu` marker: such tests are skipped, with a reason, where CUDA is absent.
- ``inferlab_case``: a test taking this fixture is parametrized over engines x prompt lengths x
  output lengths x metrics, chosen by command-line options (no test edits needed).
- ``decode_benchmark``: runs one case with ``benchmark.pedantic``. Each metric (TTFT, TPOT,
  total latency) is its own benchmark entry, so ``--benchmark-compare-fail`` and
  ``inferlab gate`` judge each one separately. The requests are measured once per case, by
  the first of its metrics to run; the other metrics' rounds replay those same requests.
- The timer: pytest-benchmark reads ``timer()`` before and after each round and subtracts.
  `MetricClock` is a virtual clock that advances, inside the round, by the metric measured
  with CUDA events (after the run's single synchronize), so the difference is exactly that
  metric. A bare host clock around asynchronous work never enters the numbers.
- ``machine_info["inferlab"]`` records the GPU, the model and the dtype; comparing against a
  saved run from another GPU, model or dtype stops with a clear message.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest

METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


class MetricClock:
    """A virtual clock in seconds: `advance(ms)` moves it; calling it reads it."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def advance(self, milliseconds: float) -> None:
        self.seconds += milliseconds / 1e3


METRIC_CLOCK = MetricClock()


@dataclass(frozen=True)
class PerfCase:
    """One benchmark entry: what is run and which metric its statistics series holds."""

    engine: str
    prompt_length: int
    output_length: int
    metric: str
    batch_size: int = 1

    @property
    def id(self) -> str:
        return f"{self.engine}-b{self.batch_size}-p{self.prompt_length}-n{self.output_length}-{self.metric}"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise pytest.UsageError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise pytest.UsageError(f"expected comma-separated positive integers, got {text!r}")
    return values


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("inferlab", "inferlab decode benchmarks")
    group.addoption("--inferlab-model", default=None,
                    help="model to benchmark (default: tinyllama-1.1b-random on CUDA, the test's own on CPU)")
    group.addoption("--inferlab-dtype", default=None, help="bf16, fp16 or fp32 (default: bf16 on CUDA, fp32 on CPU)")
    group.addoption("--inferlab-device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    group.addoption("--inferlab-engines", default="eager,hf", help="comma-separated engines (default eager,hf)")
    group.addoption("--inferlab-output-lengths", default="10,50,100,500", help="comma-separated (default 10,50,100,500)")
    group.addoption("--inferlab-prompt-lengths", default="128,512", help="comma-separated (default 128,512)")
    group.addoption("--inferlab-batch-sizes", default="1", help="comma-separated (default 1)")
    group.addoption("--inferlab-metrics", default=",".join(METRICS), help="comma-separated subset of ttft_ms,tpot_ms,e2e_ms")
    group.addoption("--inferlab-rounds", type=int, default=10, help="measured rounds per entry (default 10)")
    group.addoption("--inferlab-warmup", type=int, default=2, help="warm-up rounds per entry (default 2)")
    group.addoption("--inferlab-inject-delay-ms", type=float, default=0.0,
                    help="add this many ms to every decode step (a known slowdown, to test a gate)")
    group.addoption("--inferlab-inject-on", choices=("auto", "host", "device"), default="auto",
                    help="where the injected delay runs: a host busy-wait, a CUDA sleep kernel on the stream, or "
                         "auto (default): device for engines replaying CUDA graphs (GPU-bound), host otherwise")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped with a reason when none is present)")
    config.addinivalue_line("markers", "perf: a benchmark that records timings")
    if config.getoption("--inferlab-rounds") < 1:
        raise pytest.UsageError("--inferlab-rounds must be at least 1")
    if config.getoption("--inferlab-warmup") < 0:
        raise pytest.UsageError("--inferlab-warmup must be 0 or more")
    delay = config.getoption("--inferlab-inject-delay-ms")
    if not (math.isfinite(delay) and delay >= 0):
        raise pytest.UsageError(f"--inferlab-inject-delay-ms must be a finite number of ms, 0 or more, got {delay}")
    cases_from_options(config)  # a bad --inferlab-* value stops here, as a usage error, before collection
    _session(config)  # so do a bad --inferlab-device, --inferlab-dtype or --inferlab-model


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = _cuda_available()
    skip = pytest.mark.skip(reason="needs a CUDA device; none is available here")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip)
        if "decode_benchmark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.benchmark(timer=METRIC_CLOCK, disable_gc=True))


def cases_from_options(config: pytest.Config) -> list[PerfCase]:
    """The cartesian product the command-line options ask for."""
    from inferlab.decode.engines import ENGINE_NAMES

    engines = [e.strip() for e in config.getoption("--inferlab-engines").split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINE_NAMES]
    if unknown or not engines:
        raise pytest.UsageError(f"--inferlab-engines: unknown {unknown}; use some of {', '.join(ENGINE_NAMES)}")
    metrics = [m.strip() for m in config.getoption("--inferlab-metrics").split(",") if m.strip()]
    if not metrics or any(m not in METRICS for m in metrics):
        raise pytest.UsageError(f"--inferlab-metrics: use some of {', '.join(METRICS)}")
    return [
        PerfCase(engine, prompt, output, metric, batch)
        for engine in engines
        for batch in _int_list(config.getoption("--inferlab-batch-sizes"))
        for prompt in _int_list(config.getoption("--inferlab-prompt-lengths"))
        for output in _int_list(config.getoption("--inferlab-output-lengths"))
        for metric in metrics
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "inferlab_case" in metafunc.fixturenames:
        cases = cases_from_options(metafunc.config)
        metafunc.parametrize("inferlab_case", cases, ids=[c.id for c in cases])


@dataclass(frozen=True)
class Session:
    """What every benchmark in this pytest session shares."""

    device: object
    dtype: object
    model_name: str | None  # None: each test names its own


def _session(config: pytest.Config) -> Session:
    from inferlab.model.devices import resolve_device, resolve_dtype
    from inferlab.errors import UsageError

    from inferlab.model.registry import check_model_name

    try:
        device = resolve_device(config.getoption("--inferlab-device"))
        dtype = resolve_dtype(config.getoption("--inferlab-dtype"), device)
        if config.getoption("--inferlab-model") is not None:
            check_model_name(config.getoption("--inferlab-model"))
    except UsageError as error:
        raise pytest.UsageError(str(error)) from None
    return Session(device, dtype, config.getoption("--inferlab-model"))


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    from inferlab.measure import fingerprint
    from inferlab.model.devices import dtype_name

    session = _session(config)
    env = fingerprint.environment(session.device)
    machine_info["inferlab"] = {
        key: env[key] for key in ("device_type", "device_name", "device_count", "driver", "cuda", "torch", "transformers")
    }
    machine_info["inferlab"].update(
        model=session.model_name or "each test's own",
        dtype=dtype_name(session.dtype),
        layout="single",
    )


COMPARED_KEYS = ("device_name", "device_count", "model", "dtype", "layout")


def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark) -> None:
    ours = machine_info.get("inferlab") or {}
    theirs = (compared_benchmark.get("machine_info") or {}).get("inferlab") or {}
    for key in COMPARED_KEYS:
        if key in ours and key in theirs and ours[key] != theirs[key]:
            raise pytest.UsageError(
                f"cannot compare with the saved run: its {key} is {theirs[key]!r}, this run's is {ours[key]!r}; "
                "compare runs made on the same GPU with the same model, dtype and layout"
            )


def _default_model_name(device) -> str:
    return "tinyllama-1.1b-random" if device.type == "cuda" else "tiny-random"


class _Models:
    """Models and engines, loaded once per session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._models: dict = {}
        self._engines: dict = {}
        # (model, engine, batch, prompt, output, rounds, warm-up) -> the requests measured for the
        # first metric of that case; its other metrics replay them (same requests, own series).
        self.recorded: dict = {}

    def model(self, name: str):
        from inferlab.model.registry import load_model

        if name not in self._models:
            self._models[name] = load_model(name, self.session.device, self.session.dtype)
        return self._models[name]

    def engine(self, name: str, engine: str):
        from inferlab.decode.engines import make_engine

        key = (name, engine)
        if key not in self._engines:
            self._engines[key] = make_engine(engine, self.model(name).model)
        return self._engines[key]


@pytest.fixture(scope="session")
def inferlab_models(pytestconfig: pytest.Config) -> _Models:
    return _Models(_session(pytestconfig))


class DelayedClock:
    """Wraps a TokenClock and adds a fixed delay before every mark but the first (each decode step)."""

    def __init__(self, clock, delay_ms: float, on: str, device) -> None:
        self.clock, self.delay_ms, self.on, self.device = clock, delay_ms, on, device
        self._marks = 0
        self._cycles_per_ms = _cuda_cycles_per_ms(device) if on == "device" else None

    def start(self) -> None:
        self._marks = 0
        self.clock.start()

    def mark(self) -> None:
        if self._marks > 0:
            if self.on == "device":
                import torch

                torch.cuda._sleep(int(self.delay_ms * self._cycles_per_ms))
            else:
                end = time.perf_counter() + self.delay_ms / 1e3
                while time.perf_counter() < end:
                    pass
        self._marks += 1
        self.clock.mark()

    def finish(self):
        return self.clock.finish()


def inject_where(option: str, engine, device) -> str:
    """Where a per-step delay lengthens the step: on the host when the host is the bottleneck
    (eager loops launch kernel by kernel), on the GPU stream when the GPU is (graph replay runs
    ahead of the host, so a host wait would hide in the queue)."""
    if option != "auto":
        return option
    graphs = bool(getattr(getattr(engine, "options", None), "graphs", False))
    return "device" if device.type == "cuda" and graphs else "host"


def _cuda_cycles_per_ms(device) -> float:
    import torch

    if device.type != "cuda":
        raise pytest.UsageError("--inferlab-inject-on device needs a CUDA device")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 50_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


@pytest.fixture
def decode_benchmark(benchmark, inferlab_models: _Models, pytestconfig: pytest.Config):
    """measure(case, model=None): benchmark one case; returns the measured RunTimes."""
    import torch

    from inferlab.measure.bench import BenchConfig, build_prompt, check_fits, decode_config, make_fingerprint, run_once
    from inferlab.measure.memory import check_memory
    from inferlab.measure.metrics import summarize
    from inferlab.measure.clocks import clock_for

    def measure(case: PerfCase, model: str | None = None, rounds: int | None = None, warmup: int | None = None):
        session = inferlab_models.session
        name = session.model_name or model or _default_model_name(session.device)
        loaded = inferlab_models.model(name)
        engine = inferlab_models.engine(name, case.engine)
        rounds = rounds or pytestconfig.getoption("--inferlab-rounds")
        warmup = pytestconfig.getoption("--inferlab-warmup") if warmup is None else warmup
        config = BenchConfig(engine=case.engine, prompt_length=case.prompt_length, batch_size=case.batch_size,
                             output_length=case.output_length, warmup_runs=warmup, runs=rounds)
        check_memory(loaded, case.batch_size, case.prompt_length, case.output_length)  # before the prompt is allocated
        prompt, decode = build_prompt(loaded, config), decode_config(loaded, config)
        check_fits(loaded, prompt.length, case.output_length)
        if hasattr(engine, "prepare"):
            engine.prepare(prompt, decode)
        clock = clock_for(loaded.device, case.output_length)
        delay = pytestconfig.getoption("--inferlab-inject-delay-ms")
        if delay > 0:
            where = inject_where(pytestconfig.getoption("--inferlab-inject-on"), engine, loaded.device)
            clock = DelayedClock(clock, delay, where, loaded.device)
        key = (name, case.engine, case.batch_size, case.prompt_length, case.output_length, rounds, warmup)
        recorded = inferlab_models.recorded.get(key)
        generator = torch.Generator(device=loaded.device).manual_seed(0)
        runs = []

        def one_round() -> None:
            if recorded is not None:  # another metric of this case already measured these requests
                run = recorded[len(runs)]
            else:
                run = run_once(engine, prompt, decode, generator, clock, loaded.device)
            runs.append(run)
            value = getattr(run, case.metric)
            METRIC_CLOCK.advance(value if value is not None else 0.0)

        benchmark.pedantic(one_round, rounds=rounds, warmup_rounds=warmup, iterations=1)
        inferlab_models.recorded.setdefault(key, tuple(runs))
        measured = runs[warmup:]
        summary = summarize(measured, case.batch_size)
        benchmark.extra_info.update(
            metric=case.metric,
            unit="ms (pytest-benchmark shows seconds)",
            fingerprint=make_fingerprint(loaded, config, prompt.length),
            ttft_ms=summary["ttft_ms"],
            tpot_ms=summary["tpot_ms"],
            e2e_ms=summary["e2e_ms"],
            output_tokens_per_s=summary["output_tokens_per_s"],
            decode_tokens_per_s=summary["decode_tokens_per_s"],
            injected_delay_ms=delay,
        )
        return measured

    return measure
