"""A known violation, injected on purpose: a decode-step delay that grows with the cache position.

It proves the sweep's verdicts end to end: with it, TPOT grows with the context far beyond
what the KV cache explains, so "total latency grows linearly" must not hold. Never on by default.

The delay is added by wrapping the engine's clock: every ``mark()`` after the first (each decode
step) first waits ``per_position_us`` x the cache position that step wrote. Where the wait runs
matters: an engine that launches kernel by kernel is bound by the host, so a host busy-wait
lengthens its step; an engine replaying CUDA graphs runs ahead of the host, so a host wait would
hide in the queue and a CUDA sleep kernel on the stream is used instead.
"""

from __future__ import annotations

import time

import torch


def where_to_inject(engine, device: torch.device) -> str:
    """"device" for engines replaying CUDA graphs on a CUDA device, "host" otherwise."""
    graphs = bool(getattr(getattr(engine, "options", None), "graphs", False))
    return "device" if device.type == "cuda" and graphs else "host"


def cuda_cycles_per_ms(device: torch.device) -> float:
    """How many `torch.cuda._sleep` cycles last one millisecond on `device` (timed with events)."""
    cycles = 50_000_000
    with torch.cuda.device(device):
        torch.cuda._sleep(cycles)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
    return cycles / start.elapsed_time(end)


def host_wait(seconds: float) -> None:
    """Spin on the host clock for `seconds`. Not a sleep: a sleep overshoots, by far on a busy
    machine (on a loaded 2-core VM, steps meant to wait 8-30 ms took 110-130 ms with a sleep)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class PositionDelayClock:
    """Wraps a TokenClock: before the mark of decode step i (i >= 1), wait
    ``per_position_us`` x (prompt_length + i - 1) microseconds, the cache position that step wrote."""

    def __init__(self, clock, per_position_us: float, prompt_length: int, where: str, device: torch.device) -> None:
        if per_position_us < 0:
            raise ValueError(f"the injected delay per position must be >= 0 us, got {per_position_us}")
        if where not in ("host", "device"):
            raise ValueError(f"the injected delay runs on 'host' or 'device', got {where!r}")
        self.clock, self.per_position_us, self.prompt_length, self.where = clock, per_position_us, prompt_length, where
        self._cycles_per_ms = cuda_cycles_per_ms(device) if where == "device" else None
        self._marks = 0

    def delay_us(self, step: int) -> float:
        """The delay before decode step `step`'s mark (step 0, the prefill, gets none)."""
        return 0.0 if step == 0 else self.per_position_us * (self.prompt_length + step - 1)

    def start(self) -> None:
        self._marks = 0
        self.clock.start()

    def mark(self) -> None:
        delay_us = self.delay_us(self._marks)
        if delay_us > 0:
            if self.where == "device":
                torch.cuda._sleep(int(delay_us / 1e3 * self._cycles_per_ms))
            else:
                host_wait(delay_us / 1e6)
        self._marks += 1
        self.clock.mark()

    def finish(self) -> tuple[float, ...]:
        return self.clock.finish()
