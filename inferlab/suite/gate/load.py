"""Reading saved pytest-benchmark runs, and checking that two sides can be compared."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from inferlab.errors import UsageError
from inferlab.names import COMPARED_KEYS

# machine_info["inferlab"] keys that must agree (inferlab.names), and the
# per-benchmark fingerprint keys that must agree.
MACHINE_KEYS = COMPARED_KEYS


FINGERPRINT_KEYS = ("model", "dtype", "engine", "layout")


SAVE_HINT = "pass a run saved by pytest with --benchmark-autosave --benchmark-save-data (or --benchmark-json)"


SHOWN_NAMES = 3


# Below this many rounds a run cannot show its own noise (one round has no spread to resample),
# and the interval would be too narrow: the gate refuses rather than FAIL on it.
MIN_ROUNDS = 3


MAX_ROUND_S = 1e6  # about 11 days: a longer round time is a broken file, and its ms would overflow


MAX_RUN_BYTES = 256 * 2**20  # a real run is a few MB; bigger is not a pytest-benchmark run



@dataclass(frozen=True)
class Series:
    """One benchmark entry of one run: its raw round times in seconds, as saved."""

    fullname: str
    name: str
    metric: str
    rounds_s: tuple[float, ...]
    fingerprint: Mapping[str, object]  # the FINGERPRINT_KEYS of extra_info["fingerprint"], when saved

    @property
    def rounds_ms(self) -> tuple[float, ...]:
        return tuple(1e3 * r for r in self.rounds_s)

    @property
    def median_ms(self) -> float:
        return 1e3 * float(np.median(self.rounds_s))



@dataclass(frozen=True)
class Run:
    """One saved pytest-benchmark run: where it came from, its machine, its benchmark entries."""

    path: Path
    machine: Mapping[str, object]  # machine_info["inferlab"], or empty for a plain run
    series: tuple[Series, ...]
    digest: str = ""  # sha256 of the file: the same run given twice is told apart from a repeat

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.fullname for s in self.series)

    def get(self, fullname: str) -> Series:
        return next(s for s in self.series if s.fullname == fullname)



def load_run(path: Path) -> Run:
    """Read one pytest-benchmark JSON file (never written to); UsageError naming the fix if it is unusable."""
    path = Path(path)
    raw = _read_bytes(path)
    return _parse_run(path, _decode_json(path, raw), hashlib.sha256(raw).hexdigest())



def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise UsageError(f"{path} is a folder: pass one run's JSON file, e.g. .benchmarks/<machine>/0001_*.json")
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would hang the read, or never end
            raise UsageError(f"{path} is not a regular file: {SAVE_HINT}")
        if info.st_size > MAX_RUN_BYTES:
            raise UsageError(f"{path} is {info.st_size / 2**20:.0f} MiB, more than a pytest-benchmark run "
                             f"({MAX_RUN_BYTES // 2**20} MiB at most): {SAVE_HINT}")
        with open(path, "rb") as handle:
            return handle.read(MAX_RUN_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file: {SAVE_HINT}") from None
    except OSError as error:
        raise UsageError(f"cannot read {path} ({error.strerror}): check the path and its permissions") from None



def _decode_json(path: Path, raw: bytes) -> object:
    if not raw.strip():
        raise UsageError(f"{path} is empty (an interrupted run?): re-run the benchmarks with --benchmark-save-data")
    try:
        return json.loads(raw)
    except RecursionError:
        raise UsageError(f"{path} nests too deeply to be a pytest-benchmark run: {SAVE_HINT}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        where = f" (line {error.lineno}: {error.msg})" if isinstance(error, json.JSONDecodeError) else ""
        raise UsageError(f"{path} is not valid JSON{where}: {SAVE_HINT}") from None



def _parse_run(path: Path, data: object, digest: str = "") -> Run:
    entries = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not isinstance(data.get("machine_info"), dict):
        raise UsageError(f"{path} is not a pytest-benchmark run (no 'machine_info' and 'benchmarks'): {SAVE_HINT}")
    if not entries:
        raise UsageError(f"{path} holds no benchmarks (all skipped or deselected?): re-run with the perf tests selected")
    series = tuple(_parse_series(path, entry) for entry in entries)
    names = [s.fullname for s in series]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{path} holds benchmark {twice[0]} more than once: pass a run of one pytest session")
    machine = data["machine_info"].get("inferlab") or {}
    if not isinstance(machine, dict):
        raise UsageError(f"{path}: machine_info.inferlab is a {type(machine).__name__}, not an object: {SAVE_HINT}")
    return Run(path, MappingProxyType(dict(machine)), series, digest)



def _parse_series(path: Path, entry: object) -> Series:
    if not isinstance(entry, dict) or not isinstance(entry.get("fullname"), str) or not isinstance(entry.get("stats"), dict):
        raise UsageError(f"{path} is not a pytest-benchmark run (a benchmark without fullname or stats): {SAVE_HINT}")
    name = entry["fullname"]
    data = entry["stats"].get("data")
    if not data:
        raise UsageError(f"{path}: {name} was saved without raw data: re-run with --benchmark-save-data")
    if not isinstance(data, list) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < MAX_ROUND_S for x in data):
        raise UsageError(f"{path}: {name} has round times that are not positive numbers of seconds below {MAX_ROUND_S:g}: "
                         "check that the test measures something")
    extra = entry.get("extra_info") if isinstance(entry.get("extra_info"), dict) else {}
    fingerprint = extra.get("fingerprint") if isinstance(extra.get("fingerprint"), dict) else {}
    return Series(
        fullname=name,
        name=str(entry.get("name") or name),
        metric=str(extra.get("metric") or "time"),
        rounds_s=tuple(float(x) for x in data),
        fingerprint=MappingProxyType({k: fingerprint[k] for k in FINGERPRINT_KEYS if k in fingerprint}),
    )



def check_comparable(base_runs: Sequence[Run], head_runs: Sequence[Run]) -> None:
    """UsageError unless every run holds the same benchmarks, made on the same machine, model, dtype and engine."""
    if not base_runs or not head_runs:
        raise UsageError("gate needs at least one base and one head run: inferlab gate BASE.json HEAD.json")
    _check_distinct(base_runs, "base")
    _check_distinct(head_runs, "head")
    reference = base_runs[0]
    for run in list(base_runs[1:]) + list(head_runs):
        _check_same_benchmarks(reference, run)
        _check_same_machine(reference, run)
        _check_same_fingerprints(reference, run)
    for run in list(base_runs) + list(head_runs):
        _check_enough_rounds(run)



def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else "")



def _check_same_benchmarks(reference: Run, run: Run) -> None:
    only_reference = [n for n in reference.names if n not in set(run.names)]
    only_run = [n for n in run.names if n not in set(reference.names)]
    if only_reference or only_run:
        parts = [f"{len(names)} only in {path} ({_names(names)})"
                 for names, path in ((only_reference, reference.path), (only_run, run.path)) if names]
        raise UsageError(f"benchmarks differ: {'; '.join(parts)}: run the same tests with the same options on both sides")



def _check_same_machine(reference: Run, run: Run) -> None:
    for key in MACHINE_KEYS:
        if reference.machine.get(key) != run.machine.get(key):
            raise UsageError(
                f"{reference.path} and {run.path} differ in {key} ({reference.machine.get(key)!r} vs {run.machine.get(key)!r}): "
                "compare runs made on the same device with the same model, dtype and layout"
            )



def _check_same_fingerprints(reference: Run, run: Run) -> None:
    for series in reference.series:
        other = run.get(series.fullname)
        for key in FINGERPRINT_KEYS + ("metric",):
            ours = series.metric if key == "metric" else series.fingerprint.get(key)
            theirs = other.metric if key == "metric" else other.fingerprint.get(key)
            if ours != theirs:
                raise UsageError(
                    f"{series.fullname}: {key} is {ours!r} in {reference.path} but {theirs!r} in {run.path}: "
                    "compare runs of the same model, dtype, engine and layout"
                )



def _check_distinct(runs: Sequence[Run], side: str) -> None:
    """UsageError if one run is given twice on a side (same path or same bytes): it is not a repeat."""
    seen: dict[object, Path] = {}
    for run in runs:
        keys = [_resolved(run.path)] + ([run.digest] if run.digest else [])
        earlier = next((seen[key] for key in keys if key in seen), None)
        if earlier is not None:
            raise UsageError(f"{run.path} and {earlier} are the same {side} run given twice: pass each run once "
                             "(repeats must be separate pytest sessions)")
        seen.update((key, run.path) for key in keys)



def _resolved(path: Path) -> str:
    try:
        return str(Path(path).resolve())
    except OSError:
        return str(path)



def _check_enough_rounds(run: Run) -> None:
    few = [s for s in run.series if len(s.rounds_s) < MIN_ROUNDS]
    if few:
        raise UsageError(f"{run.path}: {few[0].fullname} has {len(few[0].rounds_s)} round(s); the gate needs at least "
                         f"{MIN_ROUNDS} per run to see a run's noise, so it cannot judge: re-run with more rounds "
                         "(--inferlab-rounds 10)")
