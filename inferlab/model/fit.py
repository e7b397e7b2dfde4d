"""Will a configuration fit? Its least memory need against the device's free memory, checked before allocating.

need_bytes = KV cache + prompt activations + last logits, a lower bound:

    kv      = kv_bytes_per_position x batch x (prompt + output)
    hidden  = batch x prompt x (2 x hidden_size + intermediate_size) x element size
    ids     = batch x (prompt + output) x 8 (int64 token ids and mask)
    logits  = batch x vocab_size x 4 (fp32)

Being a lower bound, it refuses only configurations that certainly cannot run (a batch of 10^8
would get the process killed by the kernel, not raise); ones near the limit still run, and a
real out-of-memory error becomes the sweep's "oom" row.
"""

from __future__ import annotations

import os

import torch

from inferlab.errors import DoesNotFit
from inferlab.model.dims import kv_bytes_per_position


def need_bytes(config, dtype: torch.dtype, batch_size: int, prompt_length: int, output_length: int) -> int:
    """The lower bound above, in bytes, for a model `config` in `dtype`."""
    element = torch.empty((), dtype=dtype).element_size()
    positions = prompt_length + output_length
    kv = kv_bytes_per_position(config, dtype) * batch_size * positions
    hidden = batch_size * prompt_length * (2 * config.hidden_size + getattr(config, "intermediate_size", 0)) * element
    return kv + hidden + batch_size * positions * 16 + batch_size * config.vocab_size * 4


def free_bytes(device: torch.device) -> int | None:
    """Free memory on `device`: CUDA's free bytes; on the CPU, available RAM within the address-space limit."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    limits = [value for value in (_available_ram(), _address_space_limit()) if value is not None]
    return min(limits) if limits else None


def _available_ram() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_limit() -> int | None:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def check_memory(loaded, batch_size: int, prompt_length: int, output_length: int, free: int | None = None) -> None:
    """DoesNotFit, in one line, when the configuration's least need exceeds the free memory of `loaded.device`."""
    if loaded.layout.kind != "single":  # split over devices: no single device holds it all
        return
    need = need_bytes(loaded.model.config, loaded.dtype, batch_size, prompt_length, output_length)
    check_need(need, loaded.device, f"batch {batch_size} x (prompt {prompt_length} + output {output_length}) tokens",
               "for the KV cache and activations", "lower the batch size or the lengths", free)


def check_need(need: int, device: torch.device, what: str, purpose: str, advice: str, free: int | None = None) -> None:
    """DoesNotFit, in one line, when `need` bytes exceed the free memory of `device`."""
    free = free_bytes(device) if free is None else free
    if free is not None and need > free:
        raise DoesNotFit(f"{what} needs at least {need / 2**30:.3g} GiB {purpose}, more than the "
                         f"{free / 2**30:.3g} GiB free on {device}: {advice}")
