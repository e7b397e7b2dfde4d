"""The unit tests run in two processes (pytest-xdist, tox.ini); a test marked `timing` runs while no
other test runs. Checked in a pytest run of its own, with two workers and the repository's fixture."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = f'''
import importlib.util

_spec = importlib.util.spec_from_file_location("repository_conftest", {str(ROOT / "conftest.py")!r})
_root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_root)
_timing_tests_run_alone = _root._timing_tests_run_alone


def pytest_configure(config):
    config.addinivalue_line("markers", "timing: runs alone")
'''

TESTS = '''
import json, os, time
import pytest

LOG = os.environ["SPANS_LOG"]


def span(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(LOG, "a") as log:
        log.write(json.dumps([name, start, time.monotonic()]) + "\\n")


@pytest.mark.timing
def test_timed():
    span("timed", 1.0)


@pytest.mark.parametrize("i", range(8))
def test_other(i):
    span(f"other-{i}", 0.25)
'''


def spans(log: Path) -> dict[str, tuple[float, float]]:
    return {name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())}


def test_a_timing_test_overlaps_no_other_test_under_two_workers(pytester, monkeypatch):
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (requirements/test.txt installs it)")
    log = pytester.path / "spans.log"
    monkeypatch.setenv("SPANS_LOG", str(log))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_spans=TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=9)
    recorded = spans(log)
    assert len(recorded) == 9
    timed_start, timed_end = recorded.pop("timed")
    overlapping = [name for name, (start, end) in recorded.items() if start < timed_end and end > timed_start]
    assert overlapping == []
    # the other tests did run side by side: two workers, not one after the other
    others = sorted(recorded.values())
    assert any(later[0] < earlier[1] for earlier, later in zip(others, others[1:]))
