"""What is this machine, and what is this model: devices, versions, parameters, config, memory."""

from __future__ import annotations

import os
import platform
from collections import Counter
from dataclasses import asdict, dataclass

import torch
import transformers

from inferlab.measure import fingerprint
from inferlab.model import dims
from inferlab.model.devices import dtype_name
from inferlab.model.registry import LoadedModel

GIB = 1024**3

# Parameter names -> the kind of module that holds them, first match wins.
MODULE_KINDS = (
    ("embed_tokens", "embedding"),
    ("self_attn", "attention"),
    ("mlp", "mlp"),
    ("norm", "norm"),
    ("lm_head", "lm_head"),
)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    capability: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class EnvironmentReport:
    cuda_available: bool
    devices: tuple[DeviceInfo, ...]
    torch: str
    transformers: str
    cuda: str | None
    cudnn: int | None
    driver: str | None
    python: str
    cpu: str
    cpu_count: int | None


def environment_report() -> EnvironmentReport:
    """CUDA availability, every visible GPU with its total and free memory, and library versions."""
    cuda = torch.cuda.is_available()
    devices = tuple(_device_info(index) for index in range(torch.cuda.device_count())) if cuda else ()
    return EnvironmentReport(
        cuda_available=cuda,
        devices=devices,
        torch=torch.__version__,
        transformers=transformers.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version() if cuda else None,
        driver=fingerprint.driver_version() if cuda else None,
        python=platform.python_version(),
        cpu=fingerprint.device_name(torch.device("cpu")),
        cpu_count=os.cpu_count(),
    )


def _device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    return DeviceInfo(index, props.name, f"{props.major}.{props.minor}", int(total), int(free))


def format_environment(report: EnvironmentReport) -> str:
    lines = [
        f"CUDA available   {'yes' if report.cuda_available else 'no'}",
        f"GPU count        {len(report.devices)}",
    ]
    for d in report.devices:
        lines.append(
            f"  cuda:{d.index}          {d.name} (sm {d.capability}), "
            f"{d.total_bytes / GIB:.1f} GiB total, {d.free_bytes / GIB:.1f} GiB free"
        )
    lines += [
        f"CUDA (torch)     {report.cuda or 'none (CPU build of torch)'}",
        f"cuDNN            {report.cudnn if report.cudnn is not None else '-'}",
        f"NVIDIA driver    {report.driver or '-'}",
        f"torch            {report.torch}",
        f"transformers     {report.transformers}",
        f"python           {report.python}",
        f"CPU              {report.cpu} ({report.cpu_count} logical cores)",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class ModelReport:
    """Counts and sizes of one loaded model; parameters shared by two modules are counted once."""

    name: str
    source: str
    architecture: str
    parameters: int
    parameters_by_kind: dict[str, int]
    parameters_by_dtype: dict[str, int]
    devices: tuple[str, ...]
    weight_bytes: int
    buffer_bytes: int
    tied_embeddings: bool
    config: dict
    kv_element_bytes: int  # the cache takes the model's dtype
    kv_bytes_per_position: int  # per cached position per sequence, all layers (model.dims)
    cuda_allocated_bytes: int | None
    cuda_reserved_bytes: int | None


def module_kind(parameter_name: str) -> str:
    """'model.layers.0.self_attn.q_proj.weight' -> 'attention'; see MODULE_KINDS."""
    for fragment, kind in MODULE_KINDS:
        if fragment in parameter_name:
            return kind
    return "other"


def config_summary(config) -> dict:
    """The config fields that shape compute and memory, with head_dim and the GQA group derived."""
    heads, kv_heads = dims.attention_heads(config), dims.kv_heads(config)
    return {
        "model_type": config.model_type,
        "layers": int(config.num_hidden_layers),
        "hidden_size": int(config.hidden_size),
        "intermediate_size": int(getattr(config, "intermediate_size", 0) or 0),
        "attention_heads": heads,
        "kv_heads": kv_heads,
        "head_dim": dims.head_dim(config),
        "query_heads_per_kv_head": heads // kv_heads,
        "vocab_size": int(config.vocab_size),
        "max_position_embeddings": int(config.max_position_embeddings),
        "rope": rope_summary(config),
        "hidden_act": getattr(config, "hidden_act", None),
        "rms_norm_eps": getattr(config, "rms_norm_eps", None),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
    }


def rope_summary(config) -> dict:
    """RoPE theta and scaling, from `rope_parameters` (transformers 5) or the older fields."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and parameters:
        return {key: value for key, value in parameters.items() if value is not None}
    out = {"rope_theta": getattr(config, "rope_theta", None)}
    if getattr(config, "rope_scaling", None):
        out["rope_scaling"] = config.rope_scaling
    return out


def inspect_model(loaded: LoadedModel) -> ModelReport:
    model = loaded.model
    by_kind: Counter = Counter()
    by_dtype: Counter = Counter()
    devices: set[str] = set()
    weight_bytes = 0
    for name, param in model.named_parameters():  # shared (tied) parameters appear once
        by_kind[module_kind(name)] += param.numel()
        by_dtype[dtype_name(param.dtype)] += param.numel()
        devices.add(str(param.device))
        weight_bytes += param.numel() * param.element_size()
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight.data_ptr() == embeddings.weight.data_ptr()
    cuda_devices = [torch.device(d) for d in devices if d.startswith("cuda")]
    allocated = sum(torch.cuda.memory_allocated(d) for d in cuda_devices) if cuda_devices else None
    reserved = sum(torch.cuda.memory_reserved(d) for d in cuda_devices) if cuda_devices else None
    return ModelReport(
        name=loaded.name,
        source=loaded.source,
        architecture=type(model).__name__,
        parameters=sum(by_kind.values()),
        parameters_by_kind=dict(by_kind),
        parameters_by_dtype=dict(by_dtype),
        devices=tuple(sorted(devices)),
        weight_bytes=weight_bytes,
        buffer_bytes=buffer_bytes,
        tied_embeddings=tied,
        config=config_summary(model.config),
        kv_element_bytes=dims.element_size(loaded.dtype),
        kv_bytes_per_position=dims.kv_bytes_per_position(model.config, loaded.dtype),
        cuda_allocated_bytes=allocated,
        cuda_reserved_bytes=reserved,
    )


def report_dict(report: ModelReport) -> dict:
    return asdict(report)


def _count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _bytes(n: int) -> str:
    return f"{n / 1e9:.3f} GB ({n / GIB:.3f} GiB)"


def format_model_report(report: ModelReport) -> str:
    c = report.config
    lines = [
        f"model            {report.name} ({report.architecture}, {report.source})",
        f"parameters       {_count(report.parameters)} ({report.parameters:,})",
    ]
    for kind, count in sorted(report.parameters_by_kind.items(), key=lambda kv: -kv[1]):
        share = 100 * count / report.parameters if report.parameters else 0.0
        lines.append(f"  {kind:<14} {_count(count):>10}  {share:5.1f}%")
    if report.tied_embeddings:
        lines.append("  lm_head        tied to the embeddings (shares their weights)")
    lines += [
        "dtypes           " + ", ".join(f"{d}: {_count(n)}" for d, n in report.parameters_by_dtype.items()),
        "devices          " + ", ".join(report.devices),
        f"weight bytes     {_bytes(report.weight_bytes)}; buffers {report.buffer_bytes / 1e6:.2f} MB",
        f"layers           {c['layers']}",
        f"hidden size      {c['hidden_size']} (MLP intermediate {c['intermediate_size']}, {c['hidden_act']})",
        f"attention        {c['attention_heads']} query heads, {c['kv_heads']} KV heads, head dim {c['head_dim']}"
        + (f" (GQA: {c['query_heads_per_kv_head']} query heads share each KV head)" if c["query_heads_per_kv_head"] > 1 else ""),
        f"vocabulary       {c['vocab_size']}",
        f"context          {c['max_position_embeddings']} positions",
        "RoPE             " + ", ".join(f"{k}={v}" for k, v in c["rope"].items()),
        f"KV cache         {report.kv_bytes_per_position:,} bytes per position "
        f"(2 x {c['layers']} layers x {c['kv_heads']} KV heads x {c['head_dim']} x {report.kv_element_bytes} bytes)",
    ]
    if report.cuda_allocated_bytes is not None:
        lines.append(
            f"CUDA memory      {report.cuda_allocated_bytes / GIB:.3f} GiB allocated, "
            f"{report.cuda_reserved_bytes / GIB:.3f} GiB reserved after loading"
        )
    return "\n".join(lines)
