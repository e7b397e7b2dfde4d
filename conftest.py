"""Shared fixtures: models are loaded once per session, on the CPU, in fp32."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

# The plugin (gpu marker, benchmark options) is registered by the installed package's entry
# point; from a bare checkout (PYTHONPATH=.) load it here instead.
_ENTRY_POINTS = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
pytest_plugins = ["pytester"] + ([] if "inferlab.pytest_plugin" in _ENTRY_POINTS else ["inferlab.pytest_plugin"])

CPU = torch.device("cpu")


@pytest.fixture(scope="session")
def tiny():
    from inferlab.models import load_model

    return load_model("tiny-random", CPU, torch.float32)


@pytest.fixture(scope="session")
def smollm2():
    from inferlab.models import load_model

    return load_model("smollm2-135m", CPU, torch.float32)


@pytest.fixture(scope="session")
def cuda_device():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return torch.device("cuda")
