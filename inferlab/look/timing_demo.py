"""The same GPU work timed three ways, to show why a bare wall clock lies about CUDA.

CUDA kernels are queued and the host returns at once: a host clock read right after the
launches measures how long queuing took, not the work. Synchronizing before reading the
clock, or recording CUDA events on the stream, measures the work itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DemoResult:
    """Milliseconds for the same `repeats` matrix products, measured three ways."""

    device: str
    size: int
    repeats: int
    bare_wall_ms: float | None
    synced_wall_ms: float | None
    cuda_event_ms: float | None


def _work(a: torch.Tensor, b: torch.Tensor, repeats: int) -> torch.Tensor:
    out = a
    for _ in range(repeats):
        out = torch.mm(out, b)
    return out


def run_demo(device: torch.device, size: int, repeats: int) -> DemoResult:
    """Time `repeats` chained [size, size] bf16 products: bare, synchronized, and with events."""
    if device.type != "cuda":
        return DemoResult(str(device), size, repeats, None, None, None)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator) / size**0.5
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16, generator=generator) / size**0.5
    _work(a, b, 3)  # warm-up: cuBLAS handles and kernel selection stay out of the numbers
    torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    _work(a, b, repeats)
    bare = (time.perf_counter() - t0) * 1e3  # wrong on purpose: only the launches
    torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    _work(a, b, repeats)
    torch.cuda.synchronize(device)
    synced = (time.perf_counter() - t0) * 1e3

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    _work(a, b, repeats)
    end.record()
    end.synchronize()
    return DemoResult(str(device), size, repeats, bare, synced, start.elapsed_time(end))


def format_demo(result: DemoResult) -> str:
    """The three timings side by side, with the bare clock's error and why."""
    if result.cuda_event_ms is None:
        return (
            f"timing-demo needs a CUDA device; this run is on {result.device}, where work is synchronous and a\n"
            "wall clock is right. On a GPU it times the same chained matrix products three ways: a bare\n"
            "perf_counter around the launches (it returns as soon as the kernels are queued, so it reads a\n"
            "fraction of the real time), perf_counter after torch.cuda.synchronize(), and CUDA events on the\n"
            "stream (the last two agree). Run it with --device cuda on a machine with a GPU."
        )
    tflops = 2 * result.size**3 * result.repeats / (result.cuda_event_ms / 1e3) / 1e12
    error = (result.bare_wall_ms - result.cuda_event_ms) / result.cuda_event_ms
    return "\n".join([
        f"{result.repeats} chained {result.size}x{result.size} bf16 matrix products on {result.device}",
        f"{'method':<44}{'ms':>10}",
        f"{'bare wall clock (no synchronize)':<44}{result.bare_wall_ms:>10.3f}   error {100 * error:+.1f}%",
        f"{'wall clock after torch.cuda.synchronize()':<44}{result.synced_wall_ms:>10.3f}",
        f"{'CUDA events':<44}{result.cuda_event_ms:>10.3f}   ({tflops:.0f} TFLOP/s)",
        "The bare clock stops when the kernels are queued, not when they finish: CUDA launches are",
        "asynchronous. Synchronize before reading a host clock, or record events on the stream.",
    ])
