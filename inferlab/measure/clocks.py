"""Clocks that timestamp each generated token without disturbing the decode loop.

On CUDA the work is asynchronous: a host clock read after launching a step measures the
launch, not the step. `CudaEventClock` records one CUDA event per token on the stream and
synchronizes once, at the end. `HostClock` reads `time.perf_counter` and is right only where
the work is synchronous (the CPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch


class TokenClock(Protocol):
    """start() before the request; mark() right after each token is issued; finish() -> ms offsets."""

    def start(self) -> None: ...

    def mark(self) -> None: ...

    def finish(self) -> tuple[float, ...]: ...


class HostClock:
    """Host timestamps (``time.perf_counter`` unless `now` is given, in seconds); for synchronous (CPU) work only."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._t0 = 0.0
        self._marks: list[float] = []

    def start(self) -> None:
        self._marks = []
        self._t0 = self._now()

    def mark(self) -> None:
        self._marks.append(self._now())

    def finish(self) -> tuple[float, ...]:
        return tuple((t - self._t0) * 1e3 for t in self._marks)


class CudaEventClock:
    """One CUDA event per token on the current stream; a single synchronize in finish().

    With ``per_token=False`` only the first and the last mark are recorded (the other marks
    cost nothing), which is how the cost of per-token events is measured. The offsets of the
    unrecorded marks are then interpolated linearly, so TTFT and E2E stay exact.
    """

    def __init__(self, device: torch.device, capacity: int, per_token: bool = True) -> None:
        self._device = device
        self._per_token = per_token
        with torch.cuda.device(device):
            self._start = torch.cuda.Event(enable_timing=True)
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(capacity)]
        self._count = 0

    def start(self) -> None:
        self._count = 0
        self._start.record()

    def mark(self) -> None:
        if self._count >= len(self._events):
            self._events.append(torch.cuda.Event(enable_timing=True))
        if self._per_token or self._count == 0:
            self._events[self._count].record()
        self._count += 1

    def finish(self) -> tuple[float, ...]:
        if self._count == 0:
            return ()
        if not self._per_token and self._count > 1:
            self._events[self._count - 1].record()
        self._events[self._count - 1].synchronize()
        if self._per_token:
            return tuple(self._start.elapsed_time(e) for e in self._events[: self._count])
        first = self._start.elapsed_time(self._events[0])
        last = self._start.elapsed_time(self._events[self._count - 1])
        if self._count == 1:
            return (first,)
        gap = (last - first) / (self._count - 1)
        return tuple(first + i * gap for i in range(self._count))


def clock_for(device: torch.device, capacity: int, per_token: bool = True) -> TokenClock:
    """CUDA events on a CUDA device, perf_counter elsewhere."""
    if device.type == "cuda":
        return CudaEventClock(device, capacity, per_token)
    return HostClock()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
