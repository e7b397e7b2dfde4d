"""CPU decode latency on the offline models, small enough for any machine and for CI.

    pytest perf_tests -m "perf and not gpu" --benchmark-autosave --benchmark-save-data
"""

import pytest

from inferlab.pytest_plugin import METRICS, PerfCase

TINY_CASES = [PerfCase(engine, 16, n, metric) for engine in ("eager", "hf") for n in (8, 32) for metric in METRICS]
SMOLLM2_CASES = [PerfCase(engine, 16, 8, metric) for engine in ("eager", "hf") for metric in METRICS]


@pytest.mark.perf
@pytest.mark.parametrize("case", TINY_CASES, ids=[c.id for c in TINY_CASES])
def test_decode_latency_tiny_random(decode_benchmark, case):
    runs = decode_benchmark(case, model="tiny-random")
    assert all(run.num_tokens == case.output_length for run in runs)


@pytest.mark.perf
@pytest.mark.slow
@pytest.mark.parametrize("case", SMOLLM2_CASES, ids=[c.id for c in SMOLLM2_CASES])
def test_decode_latency_smollm2(decode_benchmark, case):
    runs = decode_benchmark(case, model="smollm2-135m", rounds=5, warmup=1)
    assert all(run.num_tokens == case.output_length for run in runs)
