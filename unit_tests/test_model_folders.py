"""Broken model folders and damaged caches: one line naming the file and what to do, or a fresh conversion."""

import json
import os
import shutil
import time

import pytest
import torch

from inferlab.cli import main
from inferlab.errors import UsageError
from inferlab.model import folders
from inferlab.model.registry import TINY_RANDOM_CONFIG, cache_dir, cached_folder, load_model, random_llama

CPU, FP32 = torch.device("cpu"), torch.float32


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """tiny-random saved by save_pretrained, without tokenizer files."""
    folder = tmp_path_factory.mktemp("models") / "good"
    random_llama(TINY_RANDOM_CONFIG, CPU, FP32, 0).save_pretrained(folder)
    return folder


def broken(saved, tmp_path, change) -> str:
    folder = tmp_path / "model"
    shutil.copytree(saved, folder)
    change(folder)
    return str(folder)


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def set_config(**fields):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(fields)
        (folder / "config.json").write_text(json.dumps(config))
    return change


def save_pickled(folder):
    (folder / "model.safetensors").unlink()

    class Planted:
        def __reduce__(self):
            return (os.system, ("echo planted",))

    torch.save({"x": Planted()}, folder / "pytorch_model.bin")


CASES = [
    ("truncated config", lambda f: (f / "config.json").write_text("{"), "config.json is not valid JSON"),
    ("empty config", lambda f: (f / "config.json").write_text(""), "config.json is not valid JSON"),
    ("config is a list", lambda f: (f / "config.json").write_text("[]"), "config.json holds a JSON list"),
    ("no config", lambda f: (f / "config.json").unlink(), "has no config.json"),
    ("unknown model_type", set_config(model_type="warp-drive"), "model_type 'warp-drive'"),
    ("remote code", set_config(model_type="custom-x", auto_map={"AutoModelForCausalLM": "modeling_x.X"}),
     "needs the folder's own Python code (auto_map)"),
    ("no weights", lambda f: (f / "model.safetensors").unlink(), "has no weights"),
    ("truncated weights", lambda f: truncate(f / "model.safetensors"), "model.safetensors is damaged"),
    ("pickled weights", save_pickled, "pytorch_model.bin is a pickled checkpoint"),
    ("truncated tokenizer", lambda f: (f / "tokenizer.json").write_text("{\"version\": "), "the tokenizer files in"),
]


@pytest.mark.parametrize("label, change, fragment", CASES, ids=[c[0] for c in CASES])
def test_a_broken_folder_is_one_line_naming_the_file(saved, tmp_path, capsys, label, change, fragment):
    folder = broken(saved, tmp_path, change)
    code = main(["inspect", folder, "--device", "cpu"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if not line.startswith("loading ")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("inferlab: error: ") and fragment in lines[0] and folder in lines[0]
    assert "planted" not in out + err


def test_a_folder_without_tokenizer_loads_for_timing_but_generate_says_what_to_do(saved, capsys):
    loaded = load_model(str(saved), CPU, FP32)
    assert loaded.tokenizer is None and loaded.source == "folder"
    code = main(["generate", str(saved), "--device", "cpu", "--prompt", "hi"])
    err = capsys.readouterr().err
    assert code == 2 and "has no tokenizer, and generate needs one" in err and "--prompt-length" not in err


def write_tiny(staging):
    write_tiny.calls += 1
    random_llama(TINY_RANDOM_CONFIG, CPU, FP32, 0).save_pretrained(staging)


@pytest.mark.parametrize("damage", [
    lambda f: truncate(f / "model.safetensors"),
    lambda f: (f / "config.json").write_text("{\"model_type\": "),
    lambda f: (f / "model.safetensors").unlink(),
], ids=["truncated safetensors", "corrupt config", "missing weights"])
def test_a_damaged_cache_is_converted_again(tmp_path, damage):
    write_tiny.calls = 0
    target = tmp_path / "cache" / "tiny"
    cached_folder(target, write_tiny)
    damage(target)
    assert not folders.cache_intact(target)
    assert cached_folder(target, write_tiny) == target
    assert write_tiny.calls == 2 and folders.cache_intact(target)
    assert [p.name for p in target.parent.iterdir()] == ["tiny"]  # nothing left aside


def test_an_intact_cache_is_not_converted_again(tmp_path):
    write_tiny.calls = 0
    target = tmp_path / "tiny"
    cached_folder(target, write_tiny)
    cached_folder(target, write_tiny)
    assert write_tiny.calls == 1


def test_staging_left_by_a_killed_conversion_is_removed(tmp_path):
    target = tmp_path / "tiny"
    dead = tmp_path / f".tiny{folders.STAGING_MARK}999999999-abc"  # no such pid
    alive = tmp_path / f".tiny{folders.STAGING_MARK}{os.getpid()}-abc"  # this process: converting now
    other = tmp_path / f".other{folders.STAGING_MARK}999999999-abc"  # another target's
    for folder in (dead, alive, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 100)
    write_tiny.calls = 0
    cached_folder(target, write_tiny)
    assert not dead.exists() and alive.exists() and other.exists()
    old = time.time() + 2 * folders.STALE_STAGING_S
    assert folders.remove_stale_staging(target, now=old) == [alive]  # stale by age, whatever its pid


def test_a_cache_path_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("INFERLAB_CACHE", str(blocker))
    with pytest.raises(UsageError, match="is a file, not a folder: point INFERLAB_CACHE at a folder"):
        cache_dir()


def test_a_damaged_hub_download_names_the_cache_folder_to_delete(saved, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / ("a" * 40)
    shutil.copytree(saved, snapshot)
    truncate(snapshot / "model.safetensors")
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("a" * 40)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "inferlab.cli", "inspect", "org/tiny", "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("loading ")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "the cached copy of 'org/tiny' is damaged" in lines[0]
    assert f"delete {tmp_path / 'hub' / 'models--org--tiny'} and download it again" in lines[0]


def test_a_cache_that_cannot_be_written_is_exit_4_and_leaves_no_staging(tmp_path):
    from inferlab.errors import WriteError

    def full_disk(staging):
        (staging / "config.json").write_text("{")
        raise OSError(28, "No space left on device")

    with pytest.raises(WriteError, match="cannot write the model cache .*No space left on device"):
        cached_folder(tmp_path / "tiny", full_disk)
    assert list(tmp_path.iterdir()) == []


def test_a_random_model_is_drawn_once_then_loaded_from_the_cache_with_the_same_weights(tmp_path, monkeypatch):
    from inferlab.model import registry

    monkeypatch.setenv("INFERLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(registry.RANDOM_CONFIGS, "tinyllama-1.1b-random", TINY_RANDOM_CONFIG)  # small, same path
    drawn = []
    draw = registry.random_llama
    monkeypatch.setattr(registry, "random_llama", lambda *a, **k: drawn.append(1) or draw(*a, **k))
    cpu = torch.device("cpu")
    first = load_model("tinyllama-1.1b-random", cpu, torch.float32, seed=3).model
    second = load_model("tinyllama-1.1b-random", cpu, torch.float32, seed=3).model
    assert drawn == [1]  # drawn once, into the cache; the second load only reads it
    direct = draw(TINY_RANDOM_CONFIG, cpu, torch.float32, 3)
    for model in (first, second):
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), direct.state_dict().values()))


def test_a_random_model_is_drawn_in_memory_where_the_cache_cannot_be_written(tmp_path, monkeypatch):
    from inferlab.model import registry

    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("INFERLAB_CACHE", str(blocked))
    monkeypatch.setitem(registry.RANDOM_CONFIGS, "tinyllama-1.1b-random", TINY_RANDOM_CONFIG)
    model = load_model("tinyllama-1.1b-random", torch.device("cpu"), torch.float32, seed=3).model
    direct = random_llama(TINY_RANDOM_CONFIG, torch.device("cpu"), torch.float32, 3)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), direct.state_dict().values()))
