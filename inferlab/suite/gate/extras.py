"""What a saved run holds besides round times: extra_info per benchmark, commit and time.

The gate's loader keeps only what the median verdicts need; tails, budgets and history read
the rest here, from a file `load_run` has already checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from inferlab.suite.gate.load import Run


@dataclass(frozen=True)
class Extras:
    """A run's extra_info per benchmark fullname, its commit_info and its datetime (as saved)."""

    extra_info: Mapping[str, Mapping[str, object]]
    commit: Mapping[str, object]
    datetime: str
    node: str


def read_extras(run: Run) -> Extras:
    """Read the parts of `run`'s file that `load_run` does not keep."""
    data = json.loads(Path(run.path).read_bytes())
    extra = {}
    for entry in data["benchmarks"]:
        info = entry.get("extra_info")
        extra[entry["fullname"]] = MappingProxyType(dict(info) if isinstance(info, dict) else {})
    commit = data.get("commit_info") if isinstance(data.get("commit_info"), dict) else {}
    node = data["machine_info"].get("node")
    return Extras(MappingProxyType(extra), MappingProxyType(dict(commit)), str(data.get("datetime") or ""),
                  str(node or ""))


def itl_requests(extras: Extras, fullname: str) -> list[list[float]] | None:
    """The per-request inter-token gaps (ms) the plugin saved for a TPOT entry, or None."""
    value = extras.extra_info.get(fullname, {}).get("itl_rounds_ms")
    if not isinstance(value, list) or not value or not all(isinstance(r, list) and r for r in value):
        return None
    return value


def floor_tpot_ms(extras: Extras, fullname: str) -> float | None:
    """The roofline floor on TPOT (ms) saved with an entry, or None."""
    roofline = extras.extra_info.get(fullname, {}).get("roofline")
    floor = roofline.get("floor_tpot_ms") if isinstance(roofline, dict) else None
    return float(floor) if isinstance(floor, (int, float)) and floor > 0 else None
