"""Energy per output token on NVIDIA GPUs, from NVML's total-energy counter.

``nvmlDeviceGetTotalEnergyConsumption`` returns the energy the whole GPU has used since the
driver loaded, in millijoules (Volta and newer). The counter is read once before a
configuration's measured runs and once after the last one has synchronized, so:

    joules = (counter_after - counter_before) / 1000
    J/token = joules / (runs x batch x output length)
    mean W = joules / seconds between the two reads

Resolution: 1 mJ. The driver refreshes the counter every few to tens of milliseconds (the
interval is measured once when the meter opens, by polling until the value changes twice), so
each end of a span can be off by up to one interval's energy: a relative uncertainty of about
2 x interval / span, stated with every reading. The counter covers the whole board, idle
power included, not only the kernels of the runs.

`nvidia-ml-py` (module ``pynvml``, the ``[gpu]`` extra) is imported only when a meter is
opened. Where it, NVML or the counter is missing, `open_meter` returns `Unavailable` with the
reason; the caller says so once and carries on.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

SOURCE = "NVML nvmlDeviceGetTotalEnergyConsumption"
RESOLUTION_J = 1e-3
INTERVAL_PROBE_S = 0.5  # the longest time spent polling for the counter's update interval


@dataclass(frozen=True)
class Unavailable:
    """No energy figure, and why."""

    reason: str

    def to_dict(self) -> dict:
        return {"available": False, "reason": self.reason}


@dataclass(frozen=True)
class EnergyReading:
    """Energy used over one span of measured runs."""

    joules: float
    seconds: float
    output_tokens: int
    update_interval_s: float | None

    @property
    def joules_per_token(self) -> float | None:
        return self.joules / self.output_tokens if self.output_tokens else None

    @property
    def mean_watts(self) -> float | None:
        return self.joules / self.seconds if self.seconds > 0 else None

    @property
    def relative_uncertainty(self) -> float | None:
        """2 x update interval / span: each read may lag the truth by up to one interval."""
        if self.update_interval_s is None or self.seconds <= 0:
            return None
        return 2 * self.update_interval_s / self.seconds

    def to_dict(self) -> dict:
        return {
            "available": True, "source": SOURCE, "resolution_j": RESOLUTION_J,
            "update_interval_s": self.update_interval_s, "joules": self.joules, "seconds": self.seconds,
            "output_tokens": self.output_tokens, "joules_per_token": self.joules_per_token,
            "mean_watts": self.mean_watts, "relative_uncertainty": self.relative_uncertainty,
        }


def energy_from_dict(data: dict | None) -> EnergyReading | Unavailable | None:
    if not data:
        return None
    if not data.get("available"):
        return Unavailable(data.get("reason", "unknown"))
    return EnergyReading(data["joules"], data["seconds"], data["output_tokens"], data.get("update_interval_s"))


class NvmlMeter:
    """Reads one GPU's energy counter; `start()` then `stop(start, tokens)` gives an `EnergyReading`."""

    def __init__(self, nvml, handle, clock: Callable[[], float] = time.perf_counter,
                 update_interval_s: float | None = None) -> None:
        self.nvml, self.handle, self.clock = nvml, handle, clock
        self.update_interval_s = update_interval_s

    def read_mj(self) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def start(self) -> tuple[int, float]:
        return self.read_mj(), self.clock()

    def stop(self, started: tuple[int, float], output_tokens: int) -> EnergyReading:
        millijoules, seconds = self.read_mj(), self.clock()
        return EnergyReading((millijoules - started[0]) / 1e3, seconds - started[1], output_tokens, self.update_interval_s)


def update_interval(read: Callable[[], int], clock: Callable[[], float], sleep: Callable[[float], None],
                    limit_s: float = INTERVAL_PROBE_S) -> float | None:
    """Seconds between two successive changes of the counter, polled every millisecond; None if it
    did not change twice within `limit_s`."""
    began = clock()
    last, changes = read(), []
    while clock() - began < limit_s and len(changes) < 2:
        sleep(1e-3)
        value = read()
        if value != last:
            changes.append(clock())
            last = value
    return changes[1] - changes[0] if len(changes) == 2 else None


def meter_from_nvml(nvml, locate: Callable[[object], object], clock: Callable[[], float] = time.perf_counter,
                    sleep: Callable[[float], None] = time.sleep) -> NvmlMeter | Unavailable:
    """Start NVML, find the device, check the counter answers, measure its update interval."""
    error_type = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error_type as error:
        return Unavailable(f"NVML did not start ({error})")
    try:
        handle = locate(nvml)
        meter = NvmlMeter(nvml, handle, clock)
        meter.read_mj()
    except (error_type, ValueError) as error:
        return Unavailable(f"the GPU's energy counter cannot be read ({error}; it needs a Volta or newer GPU)")
    meter.update_interval_s = update_interval(meter.read_mj, clock, sleep)
    return meter


def pci_bus_id(domain: int, bus: int, slot: int) -> bytes:
    """NVML's bus id format, ``%08X:%02X:%02X.0``."""
    return f"{domain:08X}:{bus:02X}:{slot:02X}.0".encode()


def cuda_locator(device: torch.device) -> Callable[[object], object]:
    """Finds `device` in NVML by its PCI bus id (CUDA and NVML may number GPUs differently), or by
    its index when no CUDA_VISIBLE_DEVICES renumbers them."""

    def locate(nvml):
        props = torch.cuda.get_device_properties(device)
        ids = tuple(getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        renumbered = os.environ.get("CUDA_VISIBLE_DEVICES") is not None
        if None in ids:
            if renumbered:
                raise ValueError("cannot match the CUDA device to an NVML device (no PCI bus id, GPUs renumbered)")
            return nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device() if device.index is None else device.index)
        return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id(*ids))

    return locate


def open_meter(device: torch.device, nvml=None) -> NvmlMeter | Unavailable:
    """A meter for `device`, or `Unavailable` saying why there is none (CPU, no nvidia-ml-py, no counter)."""
    if device.type != "cuda":
        return Unavailable(f"not measured on {device.type}: NVML's energy counter exists on NVIDIA GPUs only")
    if nvml is None:
        try:
            with warnings.catch_warnings():  # the old `pynvml` wrapper package warns that it is deprecated
                warnings.simplefilter("ignore", FutureWarning)
                import pynvml as nvml
        except ImportError:
            return Unavailable("not measured: nvidia-ml-py is not installed (pip install 'inferlab[gpu]')")
    return meter_from_nvml(nvml, cuda_locator(device))
