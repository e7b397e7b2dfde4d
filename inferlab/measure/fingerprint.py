"""What a measurement ran on: enough to refuse comparing numbers from different set-ups."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import torch
import transformers


def driver_version() -> str | None:
    """The NVIDIA driver version from nvidia-smi, or None where there is none."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name on the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_name()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """Device, software versions and host: the machine half of a fingerprint."""
    cuda = device.type == "cuda"
    return {
        "device_type": device.type,
        "device_name": device_name(device),
        "device_count": torch.cuda.device_count() if cuda else 1,
        "driver": driver_version() if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "executable": sys.executable,
    }
