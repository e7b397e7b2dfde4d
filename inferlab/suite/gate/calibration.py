"""Measured run noise, kept per machine: records that `inferlab ab` writes and `--run-noise calibrated` reads.

A record is a new JSON file ``STORE/<machine id>/<UTC time>-<random>.json``, written atomically
and never over another; the newest one for a machine is the calibration. The machine id is a
hash of the node name and of machine_info["inferlab"]'s device type, name, count, model, dtype
and layout: noise measured on one machine, model and dtype is not used for another.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping

from inferlab.errors import UsageError
from inferlab.storage import write_json_atomic, writable_folder
from inferlab.suite.gate.extras import read_extras
from inferlab.suite.gate.load import MACHINE_KEYS, Run

DEFAULT_STORE = Path(".inferlab") / "run-noise"


SCHEMA = "inferlab.run-noise/1"


def machine_key(run: Run) -> dict:
    """What must agree for a noise record to apply: node, device type and the gate's machine keys."""
    key = {"node": read_extras(run).node, "device_type": run.machine.get("device_type")}
    key.update({name: run.machine.get(name) for name in MACHINE_KEYS})
    return key


def machine_id(key: Mapping[str, object]) -> str:
    """16 hex digits of sha256 over the key as sorted JSON."""
    return hashlib.sha256(json.dumps(dict(key), sort_keys=True, default=str).encode()).hexdigest()[:16]


def save_run_noise(store: Path, run: Run, noise: Mapping[str, float], details: Mapping[str, object]) -> Path:
    """Write a new record of per-benchmark run noise for `run`'s machine; returns its path."""
    key = machine_key(run)
    folder = writable_folder(Path(store) / machine_id(key))
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    record = {"schema": SCHEMA, "machine": key, "created": stamp, "run_noise": dict(noise), **dict(details)}
    return write_json_atomic(folder / f"{stamp}-{secrets.token_hex(4)}.json", record)


def latest_run_noise(store: Path, run: Run) -> tuple[dict[str, float], Path]:
    """The newest record's per-benchmark noise for `run`'s machine, and its path; UsageError if there is none."""
    key = machine_key(run)
    folder = Path(store) / machine_id(key)
    records = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not records:
        raise UsageError(f"no calibrated run noise for this machine ({key['device_name']}, {key['model']}, {key['dtype']}) "
                         f"in {store}: run inferlab calibrate (or inferlab ab) on it first, or pass --run-noise as a fraction")
    try:
        noise = json.loads(records[-1].read_text())["run_noise"]
        noise = {str(name): float(value) for name, value in noise.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UsageError(f"{records[-1]} is not a run-noise record: move it away and calibrate again") from None
    if not noise:
        raise UsageError(f"{records[-1]} holds no benchmarks: calibrate again with inferlab ab")
    return noise, records[-1]
