"""Writing results: atomically, and never over an earlier run."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from inferlab.errors import UsageError, WriteError


def write_text_atomic(path: Path, text: str, overwrite: bool = False) -> Path:
    """Write `text` to `path` through a temporary file and a rename; refuse to replace a file unless `overwrite`."""
    return write_bytes_atomic(path, text.encode("utf-8"), overwrite)


def write_bytes_atomic(path: Path, data: bytes, overwrite: bool = False) -> Path:
    """Write `data` to `path` through a temporary file and a rename; refuse to replace a file unless `overwrite`."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise UsageError(f"{path} exists and is kept: choose another output path")
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as error:
        raise _write_error(path, error) from None
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        if overwrite:
            os.replace(temporary, path)
        else:
            _publish_exclusive(temporary, path)
    except FileExistsError:
        os.unlink(temporary)
        raise UsageError(f"{path} exists and is kept: choose another output path") from None
    except OSError as error:
        _remove_quietly(temporary)
        raise _write_error(path, error) from None
    except BaseException:
        _remove_quietly(temporary)
        raise
    return path


def _write_error(path: Path, error: OSError) -> WriteError:
    reason = error.strerror or type(error).__name__
    return WriteError(f"cannot write {path} ({reason}): free some space or choose a writable path")


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_exclusive(temporary: str, path: Path) -> None:
    try:
        os.link(temporary, path)  # fails if `path` appeared meanwhile: nothing is ever overwritten
    except FileExistsError:
        raise
    except OSError:  # a filesystem without hard links: check, then rename
        if path.exists():
            raise FileExistsError(path) from None
        os.replace(temporary, path)
        return
    os.unlink(temporary)


def write_json_atomic(path: Path, data: dict, overwrite: bool = False) -> Path:
    """`data` as indented JSON, written atomically."""
    return write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n", overwrite)


def save_json_or_fallback(path: Path, data: dict, stdout=None) -> Path:
    """Write a measurement to `path`; if that fails, to a new file in the temporary folder, else print it in full.

    A measurement is never lost to a full disk or a read-only folder: the WriteError raised names
    where the data went instead.
    """
    try:
        return write_json_atomic(path, data)
    except WriteError as error:
        text = json.dumps(data, indent=2) + "\n"
        fallback = Path(tempfile.gettempdir()) / f"inferlab-unsaved-{os.getpid()}-{Path(path).name}"
        try:
            where = f"saved instead to {write_text_atomic(fallback, text)}"
        except (WriteError, UsageError):
            (stdout or sys.stdout).write(text)
            where = "printed in full on stdout instead"
        raise WriteError(f"{error}; the measurement was {where}") from None


def writable_folder(folder: Path) -> Path:
    """Create `folder` if needed and check it can be written to; UsageError otherwise."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-", delete=True)
        probe.close()
    except OSError as error:
        raise UsageError(f"cannot write results to {folder} ({error.strerror}): choose a writable --out folder") from None
    return folder


def new_run_folder(parent: Path, label: str) -> Path:
    """A fresh folder `parent/<UTC time>-<label>[-n]` that no earlier run used."""
    parent = writable_folder(parent)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for attempt in range(1, 1000):
        name = f"{stamp}-{label}" if attempt == 1 else f"{stamp}-{label}-{attempt}"
        try:
            (parent / name).mkdir()
            return parent / name
        except FileExistsError:
            continue
    raise UsageError(f"could not create a new run folder in {parent}: clean up old runs")
