"""Decode as a memory-bound workload: bytes read per step against the device's bandwidth.

At batch 1 a decode step reads every weight once (only one row of the embedding table) plus
the KV cache so far; FLOPs are ~2 per weight, far below what the device could do in that
time, so the floor on TPOT is bytes / bandwidth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from inferlab.model.dims import kv_bytes_per_position

# Vendor datasheet memory bandwidth (bytes/s), used only with --no-probe.
DATASHEET_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 SXM": 3.35e12,
    "H100 PCIe": 2.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100-SXM4-40GB": 1.555e12,
    "L4": 0.3e12,
}


@dataclass(frozen=True)
class Roofline:
    """Bytes per decode step, and what the measured TPOT achieves of the bandwidth."""

    weight_bytes_per_step: int
    kv_bytes_per_step: float  # averaged over the decode steps
    bandwidth_bytes_per_s: float | None
    bandwidth_source: str  # "probe", "datasheet" or "unknown"

    @property
    def bytes_per_step(self) -> float:
        return self.weight_bytes_per_step + self.kv_bytes_per_step

    def floor_tpot_ms(self) -> float | None:
        """bytes per step / bandwidth: no decode step can be faster than this."""
        if not self.bandwidth_bytes_per_s:
            return None
        return self.bytes_per_step / self.bandwidth_bytes_per_s * 1e3

    def achieved(self, tpot_ms: float) -> dict:
        """Achieved bandwidth (GB/s) = bytes per step / TPOT, and its fraction of the peak."""
        achieved = self.bytes_per_step / (tpot_ms / 1e3)
        fraction = achieved / self.bandwidth_bytes_per_s if self.bandwidth_bytes_per_s else None
        return {"achieved_gb_per_s": achieved / 1e9, "fraction_of_peak": fraction}

    def to_dict(self) -> dict:
        return {
            "weight_bytes_per_step": self.weight_bytes_per_step,
            "kv_bytes_per_step": self.kv_bytes_per_step,
            "bytes_per_step": self.bytes_per_step,
            "bandwidth_gb_per_s": None if self.bandwidth_bytes_per_s is None else self.bandwidth_bytes_per_s / 1e9,
            "bandwidth_source": self.bandwidth_source,
            "floor_tpot_ms": self.floor_tpot_ms(),
        }


def unique_parameters(model) -> list[torch.nn.Parameter]:
    """Each parameter once, even when tied."""
    seen, out = set(), []
    for param in model.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            out.append(param)
    return out


def weight_bytes_per_step(model, batch_size: int) -> int:
    """All weights, except that the input embedding contributes B rows (unless tied to the LM head)."""
    total = sum(p.numel() * p.element_size() for p in unique_parameters(model))
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embedding
    if not tied:
        rows = min(batch_size, embedding.shape[0])
        total -= (embedding.shape[0] - rows) * embedding.shape[1] * embedding.element_size()
    return int(total)


def roofline(model, batch_size: int, prompt_length: int, output_length: int, bandwidth: tuple[float | None, str]) -> Roofline:
    """The roofline of decoding `output_length` tokens after a `prompt_length` prompt."""
    dtype = next(model.parameters()).dtype
    # Decode steps 1..N-1 read prompt_length + i cached positions; their mean is prompt + N/2.
    mean_context = prompt_length + output_length / 2
    kv = kv_bytes_per_position(model.config, dtype) * batch_size * mean_context
    return Roofline(weight_bytes_per_step(model, batch_size), kv, bandwidth[0], bandwidth[1])


def probe_bandwidth(device: torch.device, megabytes: int = 1024, repeats: int = 10) -> float:
    """Device copy bandwidth (bytes/s, reads + writes) of a large tensor copy, median of `repeats`."""
    numel = megabytes * 2**20 // 4
    source = torch.randn(numel, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            target.copy_(source)
            times.append(time.perf_counter() - t0)
    times.sort()
    return 2 * numel * 4 / times[len(times) // 2]


def datasheet_bandwidth(name: str) -> float | None:
    """The datasheet figure for a device name, when known."""
    for key, value in DATASHEET_BANDWIDTH.items():
        if key.lower() in name.lower():
            return value
    return None


def device_bandwidth(device: torch.device, device_name: str, probe: bool) -> tuple[float | None, str]:
    """(bytes/s, source): a copy probe, or the datasheet figure with probing off."""
    if probe:
        return probe_bandwidth(device, megabytes=1024 if device.type == "cuda" else 256), "probe"
    value = datasheet_bandwidth(device_name)
    return value, ("datasheet" if value else "unknown")
