"""Clocks: what they record, and that CUDA events need no per-token synchronization."""

import pytest
import torch

from inferlab.measure.clocks import CudaEventClock, HostClock, clock_for


def test_host_clock_offsets_are_milliseconds_from_start():
    ticks = iter([10.0, 10.002, 10.0055])  # seconds, as perf_counter gives them
    clock = HostClock(now=lambda: next(ticks))
    clock.start()
    clock.mark()
    clock.mark()
    assert clock.finish() == pytest.approx((2.0, 5.5))


def test_host_clock_restarts_cleanly():
    clock = HostClock()
    clock.start()
    clock.mark()
    clock.start()
    assert clock.finish() == ()


def test_cpu_device_gets_the_host_clock():
    assert isinstance(clock_for(torch.device("cpu"), 4), HostClock)


@pytest.mark.gpu
def test_cuda_events_time_queued_work_that_a_bare_clock_misses(cuda_device):
    a = torch.randn(4096, 4096, device=cuda_device)
    clock = CudaEventClock(cuda_device, capacity=2)
    torch.cuda.synchronize()
    clock.start()
    for _ in range(2):
        for _ in range(10):
            a = a @ a / 64
        clock.mark()
    first, second = clock.finish()
    assert 0 < first < second


@pytest.mark.gpu
def test_endpoint_events_keep_ttft_and_e2e_exact(cuda_device):
    clock = CudaEventClock(cuda_device, capacity=5, per_token=False)
    clock.start()
    for _ in range(5):
        torch.cuda._sleep(100_000)
        clock.mark()
    offsets = clock.finish()
    assert len(offsets) == 5
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert max(gaps) - min(gaps) < 1e-6  # interior marks are interpolated
