"""One prefill pass and one cached decode step, recorded stage by stage with forward hooks.

Every shape in a trace is observed on a real tensor (a hook's output, a view the attention
layer takes of it, or the KV cache after the step) and printed twice: as numbers, and in
symbols, so the table reads as the model's dataflow:

    B batch, S tokens in this pass (the prompt at prefill, 1 at decode), T positions in the
    KV cache after the pass, H hidden size, nH query heads, nKV KV heads, D head dim,
    I MLP intermediate size, V vocabulary.

Works with Llama-style transformers models (embed_tokens, rotary_emb, layers[i].self_attn
with q/k/v/o projections, layers[i].mlp with gate/up/down, norm, lm_head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferlab.decode import kvcache
from inferlab.decode.loop import prompt_positions
from inferlab.model import dims
from inferlab.model.devices import dtype_name
from inferlab.errors import UsageError
from inferlab.decode.prompts import Prompt


@dataclass(frozen=True)
class Stage:
    """One observed tensor: where it came from, its shape in numbers and in symbols."""

    phase: str  # "prefill" or "decode"
    name: str
    module: str
    shape: tuple[int, ...]
    symbols: tuple[str, ...]
    dtype: str
    note: str = ""


@dataclass(frozen=True)
class Trace:
    dims: dict[str, int]  # the symbols' values; S and T per phase are in `phase_dims`
    phase_dims: dict[str, dict[str, int]]
    stages: tuple[Stage, ...]
    next_tokens: tuple[int, ...]  # greedy choice after the decode step, per row
    layers_shown: tuple[int, ...]
    num_layers: int


def model_dims(config, batch_size: int) -> dict[str, int]:
    return {
        "B": batch_size,
        "H": int(config.hidden_size),
        "nH": dims.attention_heads(config),
        "nKV": dims.kv_heads(config),
        "D": dims.head_dim(config),
        "I": int(getattr(config, "intermediate_size", 0) or 0),
        "V": int(config.vocab_size),
    }


def _first_tensor(output) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def _layer_specs(index: int) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(stage name, module path, symbolic shape, note) of one decoder layer, in execution order."""
    p = f"model.layers.{index}"
    return [
        ("input RMSNorm", f"{p}.input_layernorm", ("B", "S", "H"), ""),
        ("q projection", f"{p}.self_attn.q_proj", ("B", "S", "nH*D"), "one query vector per query head"),
        ("k projection", f"{p}.self_attn.k_proj", ("B", "S", "nKV*D"), "GQA: only nKV key heads are computed and cached"),
        ("v projection", f"{p}.self_attn.v_proj", ("B", "S", "nKV*D"), ""),
        ("attention output", f"{p}.self_attn", ("B", "S", "H"), "softmax(Q K^T / sqrt(D)) V over T positions, then o_proj"),
        ("post-attention RMSNorm", f"{p}.post_attention_layernorm", ("B", "S", "H"), "after the residual add"),
        ("MLP gate projection", f"{p}.mlp.gate_proj", ("B", "S", "I"), "SiLU(gate) * up"),
        ("MLP up projection", f"{p}.mlp.up_proj", ("B", "S", "I"), ""),
        ("MLP output", f"{p}.mlp", ("B", "S", "H"), "down projection"),
        ("decoder layer output", p, ("B", "S", "H"), "residual stream after attention and MLP"),
    ]


def _head_specs() -> tuple[list, list]:
    before = [("token embeddings", "model.embed_tokens", ("B", "S", "H"), "one row of the embedding table per token")]
    after = [
        ("final RMSNorm", "model.norm", ("B", "S", "H"), ""),
        ("LM head logits", "lm_head", ("B", "1", "V"), "only the last position (logits_to_keep=1)"),
    ]
    return before, after


def _check_architecture(model) -> None:
    inner = getattr(model, "model", None)
    ok = inner is not None and all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))
    ok = ok and hasattr(inner.layers[0], "self_attn") and hasattr(inner.layers[0].self_attn, "q_proj")
    if not ok:
        raise UsageError(f"trace supports Llama-style models; {type(model).__name__} has a different layout")


class _Recorder:
    """Forward hooks that append a Stage per observed module output; removed by `close`."""

    def __init__(self, model, specs, dims: dict[str, int]) -> None:
        self.stages: list[Stage] = []
        self.phase = "prefill"
        self.dims = dims
        modules = dict(model.named_modules())
        self.handles = [modules[path].register_forward_hook(self._hook(name, path, symbols, note))
                        for name, path, symbols, note in specs]
        self.handles.append(modules["model.rotary_emb"].register_forward_hook(self._rope_hook))

    def _add(self, name: str, module: str, tensor: torch.Tensor, symbols: tuple[str, ...], note: str = "") -> None:
        self.stages.append(Stage(self.phase, name, module, tuple(tensor.shape), symbols, dtype_name(tensor.dtype), note))

    def _hook(self, name, path, symbols, note):
        def hook(module, args, output) -> None:
            tensor = _first_tensor(output)
            self._add(name, path, tensor, symbols, note)
            if path.endswith("q_proj"):  # the view attention takes: heads become their own axis
                b, s, _ = tensor.shape
                heads = tensor.view(b, s, -1, self.dims["D"]).transpose(1, 2)
                self._add("query heads (view)", path, heads, ("B", "nH", "S", "D"), "nH query heads")
            if path.endswith("k_proj"):
                b, s, _ = tensor.shape
                heads = tensor.view(b, s, -1, self.dims["D"]).transpose(1, 2)
                self._add("key heads (view)", path, heads, ("B", "nKV", "S", "D"),
                          f"each KV head serves nH/nKV = {self.dims['nH'] // self.dims['nKV']} query heads")
        return hook

    def _rope_hook(self, module, args, output) -> None:
        cos, sin = output
        self._add("RoPE cos", "model.rotary_emb", cos, ("B", "S", "D"), "rotation angles per position")
        self._add("RoPE sin", "model.rotary_emb", sin, ("B", "S", "D"), "applied to q and k heads")

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _cache_stages(phase: str, cache, layers: tuple[int, ...]) -> list[Stage]:
    stages = []
    for index in layers:
        layer = cache.layers[index]
        for name, tensor in (("keys", layer.keys), ("values", layer.values)):
            stages.append(Stage(phase, f"KV cache {name}", f"cache.layers[{index}]", tuple(tensor.shape),
                                ("B", "nKV", "T", "D"), dtype_name(tensor.dtype), "grows by S positions per pass"))
    return stages


@torch.inference_mode()
def trace_forward(model, prompt: Prompt, all_layers: bool = False) -> Trace:
    """Run the prompt (prefill), then one greedy decode step, recording every stage's output."""
    _check_architecture(model)
    num_layers = len(model.model.layers)
    layers = tuple(range(num_layers)) if all_layers else (0,)
    before, after = _head_specs()
    specs = before + [spec for i in layers for spec in _layer_specs(i)] + after
    dims = model_dims(model.config, prompt.batch_size)
    recorder = _Recorder(model, specs, dims)
    cache = kvcache.new_dynamic_cache(model)
    try:
        positions = prompt_positions(prompt.attention_mask)
        logits = kvcache.forward(model, prompt.input_ids, prompt.attention_mask, positions, cache)
        recorder.stages.extend(_cache_stages("prefill", cache, layers))
        tokens = logits[:, -1, :].argmax(-1)
        recorder.phase = "decode"
        mask = torch.cat([prompt.attention_mask, prompt.attention_mask.new_ones(prompt.batch_size, 1)], dim=-1)
        logits = kvcache.forward(model, tokens[:, None], mask, positions[:, -1:] + 1, cache)
        recorder.stages.extend(_cache_stages("decode", cache, layers))
    finally:
        recorder.close()
    phase_dims = {
        "prefill": {"S": prompt.length, "T": prompt.length},
        "decode": {"S": 1, "T": prompt.length + 1},
    }
    return Trace(dims, phase_dims, tuple(recorder.stages), tuple(logits[:, -1, :].argmax(-1).tolist()), layers, num_layers)


def symbol_values(trace: Trace, phase: str) -> dict[str, int]:
    return {**trace.dims, **trace.phase_dims[phase], "1": 1}


def evaluate(symbols: tuple[str, ...], values: dict[str, int]) -> tuple[int, ...]:
    """('B', 'S', 'nH*D', 'nH*D+2*nKV*D') -> (B, S, nH*D, nH*D+2*nKV*D) as numbers: sums of
    products of symbols and integers."""
    out = []
    for symbol in symbols:
        total = 0
        for term in symbol.split("+"):
            product = 1
            for factor in term.split("*"):
                product *= int(factor) if factor.isdigit() else values[factor]
            total += product
        out.append(total)
    return tuple(out)


def mismatches(trace: Trace) -> list[Stage]:
    """Stages whose observed shape differs from their symbolic shape (none for a Llama-style model)."""
    return [s for s in trace.stages if evaluate(s.symbols, symbol_values(trace, s.phase)) != s.shape]


def format_trace(trace: Trace) -> str:
    d = trace.dims
    lines = [
        f"B={d['B']}  H={d['H']}  nH={d['nH']}  nKV={d['nKV']}  D={d['D']}  I={d['I']}  V={d['V']}  "
        f"layers={trace.num_layers}",
    ]
    if len(trace.layers_shown) < trace.num_layers:
        rest = "layer 1 repeats" if trace.num_layers == 2 else f"layers 1-{trace.num_layers - 1} repeat"
        lines.append(f"layer 0 shown; {rest} it (--all-layers shows every one)")
    wrong = set(id(s) for s in mismatches(trace))
    for phase in ("prefill", "decode"):
        p = trace.phase_dims[phase]
        title = "prefill: the whole prompt in one pass" if phase == "prefill" else "decode: one new token, reusing the KV cache"
        lines += ["", f"{title}  (S={p['S']}, T={p['T']})",
                  f"{'stage':<24} {'module':<42} {'shape':<22} {'symbols':<20} {'dtype':<5} note"]
        for s in (s for s in trace.stages if s.phase == phase):
            shape = "[" + ", ".join(map(str, s.shape)) + "]"
            symbols = "[" + ", ".join(s.symbols) + "]" + (" (!)" if id(s) in wrong else "")
            lines.append(f"{s.name:<24} {s.module:<42} {shape:<22} {symbols:<20} {s.dtype:<5} {s.note}")
    lines += ["", f"greedy next token after the decode step: {list(trace.next_tokens)}"]
    return "\n".join(lines)
