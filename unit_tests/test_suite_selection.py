"""Which tests `pytest` runs from the repository root: the design card's command runs the GPU perf
suite, plain `pytest` runs no benchmark. Checked in a copy of the root's conftest.py and pytest
settings, with stand-in tests, each in a pytest session of its own run in this process
(pytester's in-process runs: a fresh configuration from the command line, the copy's hooks and
pyproject's settings, as a separate process would have; without the ~4 s a process takes to
import torch and transformers through the plugin)."""

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

UNIT = '''
import pytest

def test_unit():
    pass

@pytest.mark.gpu
def test_unit_on_gpu():
    pass
'''
GPU_PERF = '''
import pytest

@pytest.mark.gpu
@pytest.mark.perf
def test_gpu_benchmark():
    pass
'''
CPU_PERF = '''
import pytest

@pytest.mark.perf
def test_cpu_benchmark():
    pass
'''


# a collect-only run with a benchmark-saving option warns that it saved nothing
pytestmark = pytest.mark.filterwarnings("ignore:Not saving anything, no benchmarks have been run")


@pytest.fixture
def repo(pytester):
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    shutil.copy(ROOT / "pyproject.toml", pytester.path / "pyproject.toml")
    for folder, name, text in (("unit_tests", "test_unit", UNIT), ("perf_tests", "test_decode_gpu", GPU_PERF),
                               ("perf_tests", "test_decode_cpu", CPU_PERF)):
        (pytester.path / folder).mkdir(exist_ok=True)
        (pytester.path / folder / f"{name}.py").write_text(text)
    return pytester


def collected(result) -> list[str]:
    return sorted(line.split("::")[-1] for line in result.stdout.lines if "::" in line)


def test_plain_pytest_at_the_root_runs_the_unit_tests_and_no_benchmark(repo):
    result = repo.runpytest_inprocess("--collect-only", "-q")
    assert collected(result) == ["test_unit", "test_unit_on_gpu"]
    result.stdout.fnmatch_lines(["*2/4 tests collected (2 deselected)*"])


def test_the_design_cards_command_collects_the_gpu_perf_suite_and_no_unit_test(repo):
    result = repo.runpytest_inprocess("-m", "gpu", "--benchmark-autosave", "--collect-only", "-q")
    assert collected(result) == ["test_gpu_benchmark"]


@pytest.mark.parametrize("args, expected", [
    (["-m", "perf and not gpu"], ["test_cpu_benchmark"]),  # tox -e perf, from the root
    (["perf_tests"], ["test_cpu_benchmark", "test_gpu_benchmark"]),
    (["unit_tests"], ["test_unit", "test_unit_on_gpu"]),  # tox -e tests
    (["-m", "gpu"], ["test_gpu_benchmark", "test_unit_on_gpu"]),  # no recording: GPU benchmarks and GPU unit tests
    (["-m", "gpu", "unit_tests"], ["test_unit_on_gpu"]),
    (["--benchmark-autosave"], ["test_cpu_benchmark", "test_gpu_benchmark"]),  # a recording run: benchmarks alone
    (["unit_tests", "--benchmark-autosave"], ["test_unit", "test_unit_on_gpu"]),  # named paths are run as named
])
def test_perf_tests_run_when_asked_for(repo, args, expected):
    assert collected(repo.runpytest_inprocess(*args, "--collect-only", "-q")) == expected


def test_the_header_says_how_to_run_the_perf_tests_when_they_are_left_out(repo):
    result = repo.runpytest_inprocess("--collect-only")
    result.stdout.fnmatch_lines(["perf_tests: not run (ask for them: pytest -m gpu --benchmark-autosave*"])


def test_the_header_says_how_to_run_the_unit_tests_when_a_recording_run_leaves_them_out(repo):
    result = repo.runpytest_inprocess("-m", "gpu", "--benchmark-autosave", "--collect-only")
    result.stdout.fnmatch_lines(["unit_tests: not run while benchmarks are recorded (run them: pytest unit_tests*"])
