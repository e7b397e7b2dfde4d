"""What one configuration costs in memory: device peaks, weights, the KV cache, the process's resident peak.

- Peak allocated / reserved: `torch.cuda.max_memory_allocated` / `max_memory_reserved` on the
  device, reset just before the configuration starts (engine preparation, warm-up and measured
  runs all count). None off CUDA.
- Weight bytes: every parameter and buffer once (tied weights once).
- KV-cache bytes at the final length: bytes per position x batch x (prompt + output), the size
  the cache holds after the last token (`roofline.kv_bytes_per_position`). A static cache
  allocated for a longer context holds more; the device peak shows that.
- Peak RSS: the process's peak resident set from `getrusage`, for the whole process so far (the
  kernel cannot reset it), so on the CPU it is an upper bound for the configuration.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch

from inferlab.measure.roofline import kv_bytes_per_position, unique_parameters


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes a configuration used; None where the figure does not exist (device peaks off CUDA)."""

    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    weight_bytes: int
    kv_cache_bytes: int
    peak_rss_bytes: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def memory_from_dict(data: dict | None) -> MemoryUsage | None:
    return None if not data else MemoryUsage(**data)


def weight_bytes(model) -> int:
    """Parameters (each once, even when tied) and buffers, in bytes."""
    params = sum(p.numel() * p.element_size() for p in unique_parameters(model))
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return int(params + buffers)


def kv_cache_bytes(model, batch_size: int, length: int) -> int:
    """K and V of `length` positions for `batch_size` sequences, all layers."""
    dtype = next(model.parameters()).dtype
    return kv_bytes_per_position(model.config, dtype) * batch_size * length


def rss_bytes(maxrss: int, platform: str = sys.platform) -> int:
    """`ru_maxrss` in bytes: Linux reports kibibytes, macOS bytes."""
    return maxrss if platform == "darwin" else maxrss * 1024


def peak_rss_bytes() -> int | None:
    """The process's peak resident set so far, or None where `resource` does not exist (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return rss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def reset_peaks(device: torch.device) -> None:
    """Start the device's peak counters afresh (CUDA only; nothing to reset elsewhere)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_peaks(device: torch.device) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since `reset_peaks`; (None, None) off CUDA."""
    if device.type != "cuda":
        return None, None
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


def measure_usage(model, device: torch.device, batch_size: int, final_length: int) -> MemoryUsage:
    """Read every figure now; call after the configuration's runs."""
    allocated, reserved = device_peaks(device)
    return MemoryUsage(allocated, reserved, weight_bytes(model), kv_cache_bytes(model, batch_size, final_length),
                       peak_rss_bytes())
