"""Per-metric thresholds: parsing `5%` or `tpot_ms=3%,default=5%`, and looking one up."""

from __future__ import annotations

import re
from typing import Mapping

from inferlab.errors import UsageError

DEFAULT_THRESHOLD = 0.05


_PERCENT = re.compile(r"^([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*%$")


_METRIC = re.compile(r"^[A-Za-z_][\w.-]*$")


THRESHOLD_EXAMPLE = "write e.g. 5% or tpot_ms=3%,default=5%"



def parse_thresholds(text: str) -> dict[str, float]:
    """'5%' -> {'default': 0.05}; 'tpot_ms=3%,default=5%' -> per metric. A missing default is 5%."""
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts) or not all(parts):
        raise UsageError(f"--threshold {text!r} has an empty entry: {THRESHOLD_EXAMPLE}")
    thresholds: dict[str, float] = {}
    for part in parts:
        metric, _, value = part.rpartition("=")
        metric = metric.strip() or "default"
        if not _METRIC.match(metric):
            raise UsageError(f"--threshold {text!r}: {metric!r} is not a metric name: {THRESHOLD_EXAMPLE}")
        if metric in thresholds:
            raise UsageError(f"--threshold {text!r} sets {metric} twice: give each metric one threshold")
        thresholds[metric] = _fraction(value.strip(), text)
    thresholds.setdefault("default", DEFAULT_THRESHOLD)
    return thresholds



def _fraction(value: str, text: str) -> float:
    match = _PERCENT.match(value)
    if not match:
        raise UsageError(f"--threshold {text!r}: {value!r} is not a percentage: {THRESHOLD_EXAMPLE}")
    fraction = float(match.group(1)) / 100
    if not 0 <= fraction < 1:
        raise UsageError(f"--threshold {text!r}: {value} is outside [0%, 100%): give the slowdown that counts, e.g. 5%")
    return fraction



def threshold_for(metric: str, thresholds: Mapping[str, float]) -> float:
    """The metric's own threshold, else the default one."""
    return thresholds.get(metric, thresholds.get("default", DEFAULT_THRESHOLD))
