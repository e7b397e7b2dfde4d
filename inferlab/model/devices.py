"""Device and dtype choices, decided once at the edge and passed down explicitly."""

from __future__ import annotations

import torch

from inferlab.errors import UsageError

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
}


def resolve_device(name: str | None) -> torch.device:
    """The device to run on: `name` if given, else CUDA when available, else CPU."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown device {name!r}: use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {name!r} asked for but CUDA is not available here: use --device cpu")
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """The weights' dtype: `name` if given, else bf16 on CUDA and fp32 on CPU."""
    if name is None or name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise UsageError(f"unknown dtype {name!r}: use one of bf16, fp16, fp32") from None


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a dtype: bf16, fp16, fp32, or torch's own without the prefix (int64)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(dtype, str(dtype).removeprefix("torch."))
