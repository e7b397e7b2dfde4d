"""Shared fixtures: models are loaded once per session, on the CPU, in fp32."""

from __future__ import annotations

import importlib.metadata
import os

import pytest
import torch

# Without a GPU, Triton kernels can only run under Triton's interpreter (numpy on the CPU); it must
# be chosen before Triton is first imported. (It converts float32 to bf16 by truncation, so bf16
# kernel tests run only on CUDA.)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The plugin (gpu marker, benchmark options) is registered by the installed package's entry
# point; from a bare checkout (PYTHONPATH=.) load it here instead.
_ENTRY_POINTS = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
pytest_plugins = ["pytester"] + ([] if "inferlab.pytest_plugin" in _ENTRY_POINTS else ["inferlab.pytest_plugin"])

CPU = torch.device("cpu")


@pytest.fixture(scope="session")
def tiny():
    from inferlab.model.registry import load_model

    return load_model("tiny-random", CPU, torch.float32)


@pytest.fixture(scope="session")
def smollm2():
    from inferlab.model.registry import load_model

    return load_model("smollm2-135m", CPU, torch.float32)


@pytest.fixture(scope="session")
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")
