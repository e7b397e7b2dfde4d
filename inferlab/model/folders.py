"""Model folders on disk: checking one before loading it, and keeping the conversion cache sound.

Each check names the file at fault and what to do, so a broken folder is one line, not a
traceback from deep inside transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

from inferlab.errors import UsageError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
STAGING_MARK = ".staging-"
STALE_STAGING_S = 3600  # a staging folder without a live owner's pid is stale after this long


def read_config(folder: Path) -> dict:
    """`folder/config.json` as a dict; UsageError naming the file if it is missing, not JSON or not an object."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise UsageError(f"{folder} has no config.json: pass a folder saved by save_pretrained")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError):
        raise UsageError(f"{path} is not valid JSON (empty or truncated?): restore it, or save the model again "
                         "with save_pretrained") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not an object: restore it, or save the model "
                         "again with save_pretrained")
    return data


def check_model_type(folder: Path, config: dict) -> None:
    """UsageError unless transformers knows `model_type` natively (inferlab never runs a folder's own code)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        return
    path = Path(folder) / "config.json"
    if "auto_map" in config:
        raise UsageError(f"{path} needs the folder's own Python code (auto_map), which inferlab does not run "
                         "(trust_remote_code is off): use a model transformers supports natively")
    raise UsageError(f"{path} names model_type {model_type!r}, which this transformers does not know: "
                     "use a supported architecture or upgrade transformers")


def weight_files(folder: Path) -> list[Path]:
    """The weight files of `folder`: safetensors (one or sharded) or pickled .bin."""
    folder = Path(folder)
    found = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    return found + sorted(p for p in folder.glob("model-*-of-*.safetensors") if p.is_file())


def check_weights(folder: Path) -> None:
    """UsageError if `folder` has no weights or a safetensors file whose size does not match its header."""
    files = weight_files(folder)
    if not files:
        raise UsageError(f"{folder} has no weights ({' or '.join(WEIGHT_FILES[::2])}): copy them in, "
                         "or save the model again with save_pretrained")
    for path in files:
        if path.suffix == ".safetensors" and not safetensors_intact(path):
            raise UsageError(f"{path} is damaged (truncated, or not safetensors): download or save it again")


def safetensors_intact(path: Path) -> bool:
    """True when the file is as long as its header says: 8-byte length + JSON header + the tensors' bytes."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            (header_length,) = struct.unpack("<Q", handle.read(8))
            if header_length > size - 8:
                return False
            header = json.loads(handle.read(header_length))
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    except (OSError, struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    return size == 8 + header_length + max(ends, default=0)


def has_tokenizer(folder: Path) -> bool:
    return any((Path(folder) / name).is_file() for name in TOKENIZER_FILES)


def check_folder(folder: Path) -> None:
    """Everything `from_pretrained` would trip over, checked first: config, architecture, weights."""
    check_model_type(folder, read_config(folder))
    check_weights(folder)


def cache_intact(folder: Path) -> bool:
    """True when a cached conversion is whole: every JSON file parses, the weights are there and intact."""
    folder = Path(folder)
    try:
        read_config(folder)
        check_weights(folder)
        for path in folder.glob("*.json"):
            json.loads(path.read_bytes())
    except (UsageError, OSError, ValueError):
        return False
    return True


def staging_folder(target: Path) -> Path:
    """A new hidden folder beside `target`, named with this process's pid so that a dead owner can be told."""
    return Path(tempfile.mkdtemp(prefix=f".{target.name}{STAGING_MARK}{os.getpid()}-", dir=target.parent))


def remove_stale_staging(target: Path, now: float | None = None) -> list[Path]:
    """Remove staging folders of `target` left by a killed conversion: their pid is gone, or they are old.

    A folder whose owner still runs (a rank of the same launch converting now) is kept.
    """
    now = time.time() if now is None else now
    removed = []
    for path in Path(target.parent).glob(f".{target.name}{STAGING_MARK}*"):
        pid_text = path.name[len(f".{target.name}{STAGING_MARK}"):].split("-", 1)[0]
        try:
            old = now - path.stat().st_mtime > STALE_STAGING_S
        except OSError:
            continue
        if (pid_text.isdigit() and not _alive(int(pid_text))) or old:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def discard(folder: Path) -> None:
    """Remove a damaged cache folder: renamed aside first, so no reader sees it half deleted."""
    aside = Path(tempfile.mkdtemp(prefix=f".{folder.name}{STAGING_MARK}{os.getpid()}-", dir=folder.parent))
    try:
        os.replace(folder, aside / folder.name)
    except OSError:
        pass
    shutil.rmtree(aside, ignore_errors=True)
