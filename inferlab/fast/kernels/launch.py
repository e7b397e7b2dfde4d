"""What every kernel launch shares: programmatic dependent launch (whether the GPU has it, the
launch option), and the buffers kernels keep between launches."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessors(device: torch.device, default: int = 4) -> int:
    """The GPU's SMs, read once per device (a batched launch asks each time it runs uncaptured);
    `default` off CUDA (the interpreter runs one program at a time)."""
    if device.type != "cuda":
        return default
    return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch needs a Hopper or later GPU."""
    return device.type == "cuda" and _capability(device.index or 0)[0] >= 9


def _use_pdl(device: torch.device, pdl: bool | None) -> bool:
    """Programmatic dependent launch: each kernel is launched while the previous one runs, reads
    the weights (never written) and waits (griddepcontrol.wait) before its first read of anything
    an earlier kernel writes, and before its own writes, so the chain stays in order. None: on
    wherever supported."""
    return pdl_supported(device) if pdl is None else (pdl and pdl_supported(device))


def _launch_options(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


# Buffers the kernels keep between launches, per purpose, device and shape: scratch for partial
# results, and arrival counts that are zero between launches (each launch's last program to
# arrive resets them), so they are allocated, zeroed, once.
KEPT: dict = {}


def kept(key: tuple, make) -> tuple:
    """The buffers kept under `key`, made by `make()` the first time."""
    if key not in KEPT:
        KEPT[key] = make()
    return KEPT[key]
