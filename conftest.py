"""Shared fixtures (models are loaded once per session, on the CPU, in fp32), and which suites run.

`pytest` at the repository root collects `unit_tests` and `perf_tests` (pyproject's testpaths),
but runs the perf tests only when they are asked for: by a marker expression (`pytest -m gpu
--benchmark-autosave`, the design card's command; `pytest -m perf`), by naming paths
(`pytest perf_tests`), or by an option that saves or compares benchmarks. Plain `pytest`
deselects them, so it stays quick and records nothing. The other way round, an option that
saves or compares benchmarks, with no paths named, runs the benchmarks alone (as
`--benchmark-only` would): the design card's command records the GPU suite without running the
GPU-marked unit tests first (`pytest -m gpu` runs both; `pytest -m gpu unit_tests` the unit tests).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

try:
    import fcntl
except ImportError:  # not POSIX: timing tests take no lock
    fcntl = None

# Without a GPU, Triton kernels can only run under Triton's interpreter (numpy on the CPU); it must
# be chosen before Triton is first imported. (It converts float32 to bf16 by truncation, so bf16
# kernel tests run only on CUDA.)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (`-n 2`) a worker's environment names it as one. The pytest runs that tests
# start (in-process through pytester, or as subprocesses) are not xdist workers: pytest-benchmark
# would disable itself in them, and save nothing.
for _name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
    os.environ.pop(_name, None)

# The plugin (gpu marker, benchmark options) is registered by the installed package's entry
# point; from a bare checkout (PYTHONPATH=.) load it here instead.
_ENTRY_POINTS = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
pytest_plugins = ["pytester"] + ([] if "inferlab.pytest_plugin" in _ENTRY_POINTS else ["inferlab.pytest_plugin"])

CPU = torch.device("cpu")


@pytest.fixture(scope="session")
def tiny():
    from inferlab.model.registry import load_model

    return load_model("tiny-random", CPU, torch.float32)


@pytest.fixture(scope="session")
def smollm2():
    from inferlab.model.registry import load_model

    return load_model("smollm2-135m", CPU, torch.float32)


@pytest.fixture(scope="session")
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")


@pytest.fixture(autouse=True)
def _timing_tests_run_alone(request, tmp_path_factory):
    """Under pytest-xdist, a test marked `timing` runs while no other test runs.

    Such a test judges real timings (a gate's verdict on an injected delay); another worker's test
    on the same cores would add its own load to one side. Every test holds a shared lock; a timing
    test takes it exclusively. The turnstile gives a waiting timing test the lock next, before
    further shared holders.
    """
    if not hasattr(request.config, "workerinput") or fcntl is None:
        yield
        return
    alone = request.node.get_closest_marker("timing") is not None
    folder = tmp_path_factory.getbasetemp().parent  # shared by the workers of one run
    with open(folder / "timing.turnstile", "a") as turnstile, open(folder / "timing.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


PERF_TESTS = Path(__file__).resolve().parent / "perf_tests"


@pytest.fixture(scope="session")
def perf_script():
    """`perf_script(name)`: the measurement script perf_tests/scripts/<name>.py, imported once as
    the module `name` (registered in sys.modules while the session runs: dataclasses look their
    module up)."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(name, PERF_TESTS / "scripts" / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded[name] = module
        return loaded[name]

    yield load
    for name in loaded:
        sys.modules.pop(name, None)

# pytest-benchmark options that ask for benchmarks to be saved or compared
BENCHMARK_REQUESTS = ("benchmark_save", "benchmark_autosave", "benchmark_json", "benchmark_compare", "benchmark_only")


def benchmarks_requested(config: pytest.Config) -> bool:
    return any(config.getoption(name, None) for name in BENCHMARK_REQUESTS)


def perf_tests_asked_for(config: pytest.Config) -> bool:
    """Paths named on the command line, a -m expression, or a benchmark-saving/comparing option."""
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return True
    if config.getoption("markexpr", ""):
        return True
    return benchmarks_requested(config)


def only_perf_tests(config: pytest.Config) -> bool:
    """No paths named and a benchmark-saving/comparing option: a recording run, of the benchmarks alone."""
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS and benchmarks_requested(config)


def _in_perf_tests(item: pytest.Item) -> bool:
    return PERF_TESTS in Path(item.path).resolve().parents


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if only_perf_tests(config):
        keep_perf = True  # a recording run: the benchmarks alone
    elif perf_tests_asked_for(config):
        return
    else:
        keep_perf = False  # plain pytest: no benchmark
    deselected = [item for item in items if _in_perf_tests(item) != keep_perf]
    if deselected:
        items[:] = [item for item in items if _in_perf_tests(item) == keep_perf]
        config.hook.pytest_deselected(items=deselected)


def pytest_report_header(config: pytest.Config) -> str | None:
    if only_perf_tests(config):
        return "unit_tests: not run while benchmarks are recorded (run them: pytest unit_tests, pytest -m gpu unit_tests)"
    if perf_tests_asked_for(config):
        return None
    return "perf_tests: not run (ask for them: pytest -m gpu --benchmark-autosave, pytest -m perf, pytest perf_tests)"


class _Recording:
    """A jitted kernel that notes its name when launched."""

    def __init__(self, kernel, name, launched):
        self.kernel, self.name, self.launched = kernel, name, launched

    def __getitem__(self, grid):
        self.launched.append(self.name)
        return self.kernel[grid]


@pytest.fixture
def record_launches(monkeypatch):
    """`record_launches(names)`: the names of these jitted kernels of `inferlab.fast.kernels`, in
    launch order, for the rest of the test."""
    def record(names) -> list:
        from inferlab.fast.kernels import (attention, attention_fused, persistent, projection_attention, projections,
                                           step, stream, tma)

        launched = []
        for name in names:
            module = next(m for m in (projections, stream, tma, attention, attention_fused, projection_attention, step,
                                      persistent)
                          if hasattr(m, name))
            monkeypatch.setattr(module, name, _Recording(getattr(module, name), name, launched))
        return launched

    return record
