"""GPU decode latency: engines side by side, one pytest-benchmark entry per metric.

    pytest -m gpu --benchmark-autosave                          # at the repository root
    pytest perf_tests -m gpu --benchmark-autosave --benchmark-save-data
    pytest perf_tests -m gpu --inferlab-engines eager,hf,hf-static,fast --inferlab-output-lengths 128

The model defaults to tinyllama-1.1b-random (or pass --inferlab-model TinyLlama/TinyLlama-1.1B-Chat-v1.0).
"""

import pytest


@pytest.mark.gpu
@pytest.mark.perf
def test_decode_latency_gpu(decode_benchmark, inferlab_case):
    runs = decode_benchmark(inferlab_case)
    assert all(run.num_tokens == inferlab_case.output_length for run in runs)
