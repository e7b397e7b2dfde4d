"""pytest plugin: decode benchmarks under pytest-benchmark, timed by CUDA events.

- The `gpu` marker: such tests are skipped, with a reason, where CUDA is absent.
- ``inferlab_case``: a test taking this fixture is parametrized over engines x prompt lengths x
  output lengths x metrics, chosen by command-line options (no test edits needed).
- ``decode_benchmark``: runs one case with ``benchmark.pedantic``. Each metric (TTFT, TPOT,
  total latency) is its own benchmark entry, so ``--benchmark-compare-fail`` and
  ``inferlab gate`` judge each one separately. The requests are measured once per case, by
  the first of its metrics to run (warm-ups, then up to ``--inferlab-rounds`` requests, fewer
  once they have taken ``--inferlab-max-seconds`` but never fewer than
  ``--inferlab-min-rounds``); every metric's rounds then replay those same requests.
- The timer: pytest-benchmark reads ``timer()`` before and after each round and subtracts.
  `MetricClock` is a virtual clock that advances, inside the round, by the metric measured
  with CUDA events (after the run's single synchronize), so the difference is exactly that
  metric. A bare host clock around asynchronous work never enters the numbers.
- Saved with each entry (extra_info): percentiles, the fingerprint, the roofline (bytes per step,
  bandwidth probed once per session, ``floor_tpot_ms``), the per-request inter-token gaps of TPOT
  entries (``itl_rounds_ms``, for the gate's ITL tail) and the entry's budgets: those of an
  ``@pytest.mark.inferlab_budget(tpot_ms=1.0, ...)`` marker and of ``[tool.inferlab.budgets]`` in
  the rootdir's pyproject.toml whose pattern matches the case id (see gate/budgets.py).
- ``machine_info["inferlab"]`` records the GPU, the model and the dtype; comparing against a
  saved run from another GPU, model or dtype stops with a clear message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from inferlab.names import COMPARED_KEYS, SUITE_METRICS

METRICS = SUITE_METRICS

# The default suite: what users gate on, sized for a budget of 5 minutes on one H200, compile
# included (README, "The pytest-benchmark suite"). A case stops after DEFAULT_ROUNDS requests or DEFAULT_MAX_SECONDS of
# them, whichever comes first, with at least DEFAULT_MIN_ROUNDS. The engine is the fast one:
# graph-replayed decode moves ~0.002% from one process to the next, so a single run per side
# gates it; the host-bound eager loop moved ~20% between processes on the same H200, so one run
# per side cannot gate it (`inferlab ab` can), and its 500-token cases took most of the time.
DEFAULT_ENGINES = ("fast",)
DEFAULT_OUTPUT_LENGTHS = (10, 50, 100, 500)
DEFAULT_PROMPT_LENGTHS = (128, 512)
DEFAULT_ROUNDS = 10
DEFAULT_MIN_ROUNDS = 3
DEFAULT_MAX_SECONDS = 5.0
DEFAULT_WARMUP = 1


def _csv(values) -> str:
    return ",".join(str(v) for v in values)


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
    group.addoption("--inferlab-engines", default=_csv(DEFAULT_ENGINES),
                    help=f"comma-separated engines (default {_csv(DEFAULT_ENGINES)})")
    group.addoption("--inferlab-output-lengths", default=_csv(DEFAULT_OUTPUT_LENGTHS),
                    help=f"comma-separated (default {_csv(DEFAULT_OUTPUT_LENGTHS)})")
    group.addoption("--inferlab-prompt-lengths", default=_csv(DEFAULT_PROMPT_LENGTHS),
                    help=f"comma-separated (default {_csv(DEFAULT_PROMPT_LENGTHS)})")
    group.addoption("--inferlab-batch-sizes", default="1", help="comma-separated (default 1)")
    group.addoption("--inferlab-metrics", default=",".join(METRICS), help="comma-separated subset of ttft_ms,tpot_ms,e2e_ms")
    group.addoption("--inferlab-rounds", type=int, default=DEFAULT_ROUNDS,
                    help=f"measured rounds per case, at most (default {DEFAULT_ROUNDS})")
    group.addoption("--inferlab-min-rounds", type=int, default=DEFAULT_MIN_ROUNDS,
                    help=f"measured rounds per case, at least, whatever the time (default {DEFAULT_MIN_ROUNDS})")
    group.addoption("--inferlab-max-seconds", type=float, default=DEFAULT_MAX_SECONDS,
                    help=f"stop measuring a case once its requests have taken this long (default {DEFAULT_MAX_SECONDS:g}; "
                         "0: always --inferlab-rounds)")
    group.addoption("--inferlab-warmup", type=int, default=DEFAULT_WARMUP,
                    help=f"warm-up requests per case (default {DEFAULT_WARMUP})")
    group.addoption("--inferlab-costs", choices=("on", "off"), default="on",
                    help="on (default): after each case's timed requests, a >= 2 s block of them for its memory "
                         "peak and energy per token; off: no block (energy not measured, memory peak of the process)")
    group.addoption("--inferlab-inject-delay-ms", type=float, default=0.0,
                    help="add this many ms to every decode step (a known slowdown, to test a gate)")
    group.addoption("--inferlab-inject-on", choices=("auto", "host", "device"), default="auto",
                    help="where the injected delay runs: a host busy-wait, a CUDA sleep kernel on the stream, or "
                         "auto (default): device for engines replaying CUDA graphs (GPU-bound), host otherwise")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped with a reason when none is present)")
    config.addinivalue_line("markers", "perf: a benchmark that records timings")
    config.addinivalue_line("markers", "inferlab_budget(**budgets): absolute budgets saved with the entry, "
                                       "e.g. tpot_ms=1.0, ttft_ms_p99=30, tpot_floor_x=1.5")
    if config.getoption("--inferlab-rounds") < 1:
        raise pytest.UsageError("--inferlab-rounds must be at least 1")
    if config.getoption("--inferlab-warmup") < 0:
        raise pytest.UsageError("--inferlab-warmup must be 0 or more")
    if config.getoption("--inferlab-min-rounds") < 1:
        raise pytest.UsageError("--inferlab-min-rounds must be at least 1")
    if config.getoption("--inferlab-max-seconds") < 0:
        raise pytest.UsageError("--inferlab-max-seconds must be 0 or more")
    delay = config.getoption("--inferlab-inject-delay-ms")
    if not (math.isfinite(delay) and delay >= 0):
        raise pytest.UsageError(f"--inferlab-inject-delay-ms must be a finite number of ms, 0 or more, got {delay}")
    cases_from_options(config)  # a bad --inferlab-* value stops here, as a usage error, before collection
    _session(config)  # so do a bad --inferlab-device, --inferlab-dtype or --inferlab-model
    config.stash[_BUDGETS] = _pyproject_budgets(config)


_BUDGETS = pytest.StashKey[list]()


def _pyproject_budgets(config: pytest.Config) -> list:
    """[tool.inferlab.budgets] of the rootdir's pyproject.toml; a bad table is a usage error."""
    from inferlab.suite.gate.budgets import read_pyproject_budgets

    path = config.rootpath / "pyproject.toml"
    try:
        return read_pyproject_budgets(path) if path.is_file() else []
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def entry_budgets(node, pyproject_budgets: list, case_id: str, metric: str) -> list[dict]:
    """The budgets that judge this entry, as saved in extra_info: {key, value, source}."""
    from inferlab.suite.gate.budgets import applies, budgets_from_table

    budgets = []
    for marker in node.iter_markers("inferlab_budget"):
        try:
            budgets += budgets_from_table({"*": dict(marker.kwargs)}, f"marker on {node.nodeid}")
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
    budgets += pyproject_budgets
    return [{"key": _budget_key(b), "value": b.limit, "source": b.source} for b in budgets if applies(b, case_id, metric)]


def _budget_key(budget) -> str:
    if budget.per_floor:
        return "tpot_floor_x"
    return budget.metric if budget.stat == "median" else f"{budget.metric}_{budget.stat}"


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




def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark) -> None:
    ours = machine_info.get("inferlab") or {}
    theirs = (compared_benchmark.get("machine_info") or {}).get("inferlab") or {}
    for key in COMPARED_KEYS:
        if key in ours and key in theirs and ours[key] != theirs[key]:
            raise pytest.UsageError(
                f"cannot compare with the saved run: its {key} is {theirs[key]!r}, this run's is {ours[key]!r}; "
                "compare runs made on the same GPU with the same model, dtype and layout"
            )


class _Models:
    """Models and engines, loaded once per session."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._models: dict = {}
        self._engines: dict = {}
        # (model, engine, batch, prompt, output, rounds, warm-up) -> the requests measured for the
        # first metric of that case; its other metrics replay them (same requests, own series).
        self.recorded: dict = {}
        self.costs: dict = {}  # the same key -> {"memory": ..., "energy": ...} of those requests
        self._meter = None
        self._bandwidth = None

    def energy_meter(self):
        """NVML's energy meter for the session's device, opened once (or why there is none)."""
        from inferlab.measure import energy

        if self._meter is None:
            self._meter = energy.open_meter(self.session.device)
        return self._meter

    def bandwidth(self) -> tuple[float | None, str]:
        """The device's copy bandwidth, probed once per session (the roofline floor's denominator)."""
        from inferlab.measure.fingerprint import device_name
        from inferlab.measure.roofline import device_bandwidth

        if self._bandwidth is None:
            device = self.session.device
            self._bandwidth = device_bandwidth(device, device_name(device), probe=True)
        return self._bandwidth

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
        from inferlab.measure import inject

        if self._marks > 0:
            if self.on == "device":
                import torch

                torch.cuda._sleep(int(self.delay_ms * self._cycles_per_ms))
            else:
                inject.host_wait(self.delay_ms / 1e3)
        self._marks += 1
        self.clock.mark()

    def finish(self):
        return self.clock.finish()


def inject_where(option: str, engine, device) -> str:
    """Where a per-step delay lengthens the step (`inferlab.measure.inject.where_to_inject` for auto)."""
    from inferlab.measure import inject

    return inject.where_to_inject(engine, device) if option == "auto" else option


def _cuda_cycles_per_ms(device) -> float:
    from inferlab.measure import inject

    if device.type != "cuda":
        raise pytest.UsageError("--inferlab-inject-on device needs a CUDA device")
    return inject.cuda_cycles_per_ms(device)


@pytest.fixture
def decode_benchmark(benchmark, inferlab_models: _Models, pytestconfig: pytest.Config, request: pytest.FixtureRequest):
    """measure(case, model=None): benchmark one case; returns the measured RunTimes."""
    from inferlab.measure.bench import (BenchConfig, build_prompt, check_fits, make_fingerprint, measure_costs,
                                        prepare_case, repeat_within_budget, unmeasured_costs)
    from inferlab.model.registry import default_benchmark_model
    from inferlab.model.fit import check_memory
    from inferlab.measure.metrics import summarize
    from inferlab.measure.roofline import roofline

    def measure(case: PerfCase, model: str | None = None, rounds: int | None = None, warmup: int | None = None):
        session = inferlab_models.session
        name = session.model_name or model or default_benchmark_model(session.device)
        loaded = inferlab_models.model(name)
        engine = inferlab_models.engine(name, case.engine)
        rounds = rounds or pytestconfig.getoption("--inferlab-rounds")
        warmup = pytestconfig.getoption("--inferlab-warmup") if warmup is None else warmup
        min_rounds = min(pytestconfig.getoption("--inferlab-min-rounds"), rounds)
        budget_s = pytestconfig.getoption("--inferlab-max-seconds")
        config = BenchConfig(engine=case.engine, prompt_length=case.prompt_length, batch_size=case.batch_size,
                             output_length=case.output_length, warmup_runs=warmup, runs=rounds)
        check_memory(loaded, case.batch_size, case.prompt_length, case.output_length)  # before the prompt is allocated
        prompt = build_prompt(loaded, config)
        check_fits(loaded, prompt.length, case.output_length)
        delay = pytestconfig.getoption("--inferlab-inject-delay-ms")
        key = (name, case.engine, case.batch_size, case.prompt_length, case.output_length, rounds, warmup, budget_s)
        runs = inferlab_models.recorded.get(key)
        if runs is None:  # the first metric of this case: measure its requests (bench's path: prepare, warm up)
            prepared = prepare_case(loaded, config, engine=engine)
            if delay > 0:
                where = inject_where(pytestconfig.getoption("--inferlab-inject-on"), engine, prepared.timed)
                prepared = replace(prepared, clock=DelayedClock(prepared.clock, delay, where, prepared.timed))
            runs = tuple(repeat_within_budget(prepared.measure_one, rounds, budget_s, min_rounds))
            if pytestconfig.getoption("--inferlab-costs") == "on":
                costs = measure_costs(prepared, inferlab_models.energy_meter())
            else:
                costs = unmeasured_costs(prepared, "not measured: --inferlab-costs off")
            inferlab_models.recorded[key] = runs
            inferlab_models.costs[key] = {"memory": costs.memory.to_dict(), "energy": costs.energy.to_dict(),
                                          "prepare_ms": prepared.prepare_ms}  # compile and graph capture, never timed
        replay = iter(runs)

        def one_round() -> None:
            value = getattr(next(replay), case.metric)
            METRIC_CLOCK.advance(value if value is not None else 0.0)

        benchmark.pedantic(one_round, rounds=len(runs), warmup_rounds=0, iterations=1)
        measured = list(runs)
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
            rounds_measured=len(measured), rounds_asked=rounds, max_seconds=budget_s, warmup_rounds=warmup,
            **inferlab_models.costs[key],
            roofline=roofline(loaded.model, case.batch_size, prompt.length, case.output_length,
                              inferlab_models.bandwidth()).to_dict(),
            budgets=entry_budgets(request.node, pytestconfig.stash[_BUDGETS], case.id, case.metric),
        )
        if case.metric == "tpot_ms":  # the gaps behind the ITL tail verdict: one list per measured request
            benchmark.extra_info["itl_rounds_ms"] = [[round(gap, 6) for gap in run.itl_ms] for run in measured]
        return measured

    return measure
