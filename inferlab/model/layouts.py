"""Models split across the GPUs of one host, on existing engines: tensor and pipeline parallelism.

- ``tp:N``: tensor parallelism through transformers' ``tp_plan="auto"`` (passed as
  ``distributed_config=DistributedConfig(tp_plan="auto")``), one process per GPU,
  launched by ``torchrun`` (``torch.distributed.run``). Every rank runs the same decode loop on
  its shard of every layer; rank 0 times and reports. On the CPU the same launch runs with the
  gloo backend, which is how the launch logic is tested without GPUs.
- ``pipeline:N``: pipeline placement through accelerate's ``device_map``: consecutive decoder
  layers on consecutive GPUs, one process; activations hop from GPU to GPU inside each step.
- ``single``: everything on one device.

The layout is part of every result's fingerprint (``layout``, ``device_count``), and neither the
gate nor the pytest plugin compares results of different layouts.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from inferlab.errors import UsageError

KINDS = ("single", "tp", "pipeline")
LAUNCHED = "INFERLAB_LAUNCHED"  # set in the workers torchrun starts, so they do not launch again


@dataclass(frozen=True)
class Layout:
    """How a model is placed: `kind` over `devices` devices (1 for single)."""

    kind: str = "single"
    devices: int = 1

    def __str__(self) -> str:
        return "single" if self.kind == "single" else f"{self.kind}:{self.devices}"


def parse_layout(text: str | None) -> Layout:
    """'single', 'tp:2' or 'pipeline:2' -> Layout; UsageError otherwise."""
    if text is None or text == "single":
        return Layout()
    kind, _, count = text.partition(":")
    if kind not in ("tp", "pipeline") or not count.isdigit() or int(count) < 2:
        raise UsageError(f"unknown layout {text!r}: use single, tp:N or pipeline:N with N >= 2 devices")
    return Layout(kind, int(count))


def rank() -> int:
    """This process's rank under torchrun (0 outside it)."""
    return int(os.environ.get("RANK", "0"))


def is_launched_worker() -> bool:
    return os.environ.get(LAUNCHED) == "1" and "RANK" in os.environ


def needs_launch(layout: Layout) -> bool:
    """True when `layout` needs one process per device and this is not one of them yet."""
    return layout.kind == "tp" and not is_launched_worker()


def torchrun_command(layout: Layout, argv: list[str]) -> list[str]:
    """The command that runs `inferlab <argv>` as `layout.devices` processes on this host."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={layout.devices}",
            "-m", "inferlab.cli", *argv]


def launch(layout: Layout, argv: list[str]) -> int:
    """Run `inferlab <argv>` under torchrun and return its exit code."""
    import subprocess

    env = dict(os.environ, **{LAUNCHED: "1"})
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(torchrun_command(layout, argv), env=env).returncode


def leave_world() -> None:
    """Close the torchrun world this process joined, if any.

    Without it gloo's threads are still alive at interpreter exit, and a rank can abort
    ("terminate called without an active exception") after its work is done. The barrier first
    lets no rank close while another still waits on it.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def worker_device(requested: torch.device) -> torch.device:
    """A torchrun worker's device: cuda:LOCAL_RANK on CUDA, the CPU otherwise."""
    if requested.type != "cuda":
        return requested
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def check_devices(layout: Layout, device: torch.device) -> None:
    """UsageError when the host lacks the devices `layout` asks for."""
    if layout.kind == "single":
        return
    if layout.kind == "pipeline" and device.type != "cuda":
        raise UsageError("a pipeline layout places layers on several GPUs: use --device cuda on a host with GPUs")
    if device.type == "cuda" and torch.cuda.device_count() < layout.devices:
        raise UsageError(f"layout {layout} needs {layout.devices} GPUs, this host has {torch.cuda.device_count()}: "
                         f"use --layout single or tp:{max(torch.cuda.device_count(), 2)}")


def pipeline_device_map(num_layers: int, devices: int, tied: bool) -> dict[str, int]:
    """Consecutive decoder layers on consecutive GPUs, as even as the layer count allows.

    Embeddings and rotary tables sit with the first layers, the final norm and LM head with the
    last ones; a head tied to the embeddings stays on the first device with them.
    """
    if devices < 2 or devices > num_layers:
        raise UsageError(f"cannot split {num_layers} layers over {devices} devices: use 2 to {num_layers} devices")
    per_device, extra = divmod(num_layers, devices)
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0}
    layer = 0
    for device in range(devices):
        for _ in range(per_device + (1 if device < extra else 0)):
            device_map[f"model.layers.{layer}"] = device
            layer += 1
    device_map["model.norm"] = devices - 1
    device_map["lm_head"] = 0 if tied else devices - 1
    return device_map


def load_kwargs(layout: Layout, config, device: torch.device) -> dict:
    """The `from_pretrained` keywords that place a model in `layout`."""
    if layout.kind == "tp":
        from transformers import DistributedConfig

        # transformers joins the torchrun world and shards every layer over it
        return {"distributed_config": DistributedConfig(tp_plan="auto")}
    if layout.kind == "pipeline":
        tied = bool(getattr(config, "tie_word_embeddings", False))
        placement = pipeline_device_map(int(config.num_hidden_layers), layout.devices, tied)
        return {"device_map": {name: f"cuda:{index}" for name, index in placement.items()}}
    return {"device_map": str(device)}
