"""Every bad --inferlab-* value is a usage error (exit 4) at configure time, before any test runs.

The refusals run in pytest sessions of their own in this process (pytester's in-process runs: a
fresh configuration whose `pytest_configure` raises the usage error, as in a separate process,
without the seconds a process takes to import torch and transformers); the case that cannot fit
runs in a process of its own, as it would allocate if the check failed."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = '''
import importlib.metadata
_ENTRY_POINTS = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
pytest_plugins = [] if "inferlab.pytest_plugin" in _ENTRY_POINTS else ["inferlab.pytest_plugin"]
'''

TEST = '''
def test_never_runs():
    raise AssertionError("a bad option must stop the session before tests run")
'''


@pytest.mark.parametrize("option, value, fragment", [
    ("--inferlab-inject-delay-ms", "inf", "--inferlab-inject-delay-ms must be a finite number of ms, 0 or more, got inf"),
    ("--inferlab-inject-delay-ms", "nan", "--inferlab-inject-delay-ms must be a finite number of ms, 0 or more, got nan"),
    ("--inferlab-inject-delay-ms", "-1", "got -1.0"),
    ("--inferlab-dtype", "fp7", "unknown dtype 'fp7'"),
    ("--inferlab-device", "warp9", "unknown device 'warp9'"),
    ("--inferlab-model", "no/such/model", "unknown model 'no/such/model'"),
    ("--inferlab-model", "./missing-folder", "unknown model './missing-folder'"),
])
def test_a_bad_option_is_a_usage_error_before_collection(pytester, option, value, fragment):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_x=TEST)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--inferlab-device", "cpu", f"{option}={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(fragment in line for line in result.stderr.lines), result.stderr.str()
    assert "test_never_runs" not in result.stdout.str()


def test_a_broken_model_folder_is_a_usage_error(pytester, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_x=TEST)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--inferlab-device", "cpu", "--inferlab-model", str(folder))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any("config.json is not valid JSON" in line for line in result.stderr.lines), result.stderr.str()


HUGE_BATCH = '''
from inferlab.pytest_plugin import PerfCase

def test_huge(decode_benchmark):
    decode_benchmark(PerfCase("eager", 4, 4, "ttft_ms", batch_size=100_000_000), model="tiny-random", rounds=3, warmup=0)
'''


def test_a_case_that_cannot_fit_fails_with_the_reason_before_allocating(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_huge=HUGE_BATCH)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--inferlab-device", "cpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*DoesNotFit: batch 100000000 x (prompt 4 + output 4) tokens needs at least*"])
