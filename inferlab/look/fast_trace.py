"""The fast engine's decode step, kernel by kernel: what each fused operation reads and writes.

`inferlab trace MODEL --engine fast` runs the prompt through `inferlab.fast.engine.FastLlama`, then
one greedy decode step exactly as the fast engine does (`FastLlama.decode_hidden`, then
`greedy_step`), through `RecordingOps`: each call is passed on to the real operations (the
Triton kernels on CUDA when Triton is installed, their torch specification `decode_ops`
otherwise) and recorded with its operand shapes and what it fuses. The step's logits are then
compared with the transformers model's on the same tokens.

Symbols are those of `inferlab.look.trace`; T is the number of cached positions the step attends to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inferlab.fast import spec as decode_ops
from inferlab.model.devices import dtype_name
from inferlab.errors import UsageError
from inferlab.decode.prompts import Prompt
from inferlab.look.trace import evaluate, model_dims


@dataclass(frozen=True)
class KernelCall:
    """One operation of the decode step: which, on what, and what it produced."""

    layer: int | None  # None for the LM head and the greedy step
    kernel: str
    role: str
    reads: tuple[int, ...]  # the operand it streams: a weight matrix, or the KV cache of one layer
    reads_symbols: tuple[str, ...]
    output: tuple[int, ...]
    symbols: tuple[str, ...]
    dtype: str
    fused: str


@dataclass(frozen=True)
class FastTrace:
    dims: dict[str, int]  # trace's symbols, with S = 1 and T = prompt length + 1
    backend: str
    calls: tuple[KernelCall, ...]
    num_layers: int
    layers_shown: tuple[int, ...]
    next_tokens: tuple[int, ...]
    reference_next_tokens: tuple[int, ...]  # transformers' greedy choice at the same position
    max_abs_logit_diff: float  # fast step vs transformers, same tokens
    max_abs_logit: float


_WEIGHT_ROLES = {
    "wqkv": ("[q; k; v] projection", ("nH*D+2*nKV*D", "H"), ("B", "nH*D+2*nKV*D")),
    "wo": ("o projection", ("H", "nH*D"), ("B", "H")),
    "w13": ("[gate; up] projection", ("2*I", "H"), ("B", "I")),
    "w2": ("down projection", ("H", "I"), ("B", "H")),
}


def _gemv_fusions(kwargs: dict) -> str:
    parts = []
    if kwargs.get("norm") is not None:
        parts.append("RMSNorm of the input")
    if kwargs.get("gated"):
        parts.append("SiLU(gate) * up")
    if kwargs.get("residual") is not None:
        parts.append("+ residual")
    if kwargs.get("out_dtype") == torch.float32:
        parts.append("float32 logits")
    return ", ".join(parts)


class RecordingOps:
    """The decode step's operations, passed on to `inner` and recorded as `KernelCall`s."""

    def __init__(self, inner, net, cache) -> None:
        self.inner = inner
        self.calls: list[KernelCall] = []
        self._weights = {id(net.lm_head): (None, "lm_head")}
        self._caches = {}
        for index, layer in enumerate(net.layers):
            for name in _WEIGHT_ROLES:
                self._weights[id(getattr(layer, name))] = (index, name)
            self._caches[cache.k[index].data_ptr()] = index

    def gemv(self, x, weight, **kwargs):
        out = self.inner.gemv(x, weight, **kwargs)
        layer, name = self._weights[id(weight)]
        if name == "lm_head":
            role, reads, symbols = "LM head", ("V", "H"), ("B", "V")
        else:
            role, reads, symbols = _WEIGHT_ROLES[name]
        self.calls.append(KernelCall(layer, "gemv", role, tuple(weight.shape), reads, tuple(out.shape), symbols,
                                     dtype_name(out.dtype), _gemv_fusions(kwargs)))
        return out

    def attention_decode(self, qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads, ahead=None):
        out = self.inner.attention_decode(qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads,
                                          ahead=ahead)
        batch, kv_heads, _, head_dim = k_cache.shape
        read = (batch, kv_heads, int(position[0]) + 1, head_dim)
        group = num_heads // num_kv_heads
        fused = (f"RoPE on q and k, k and v written to the cache, softmax over T positions, "
                 f"GQA: each KV head serves {group} query heads")
        self.calls.append(KernelCall(self._caches[k_cache.data_ptr()], "attention_decode", "attention",
                                     read, ("B", "nKV", "T", "D"), tuple(out.shape), ("B", "nH*D"),
                                     dtype_name(out.dtype), fused))
        return out

    def attention_o(self, qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads, wo, residual,
                    ahead=None, ahead_gated=False):
        """Recorded as the two operations it is, or as one kernel where the inner policy fuses them."""
        policy = getattr(self.inner, "policy", None)
        if policy is None or not policy.attention_o_for(k_cache.shape[2], qkv.shape[0]):
            attended = self.attention_decode(qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads,
                                             ahead=wo)
            return self.gemv(attended, wo, residual=residual, ahead=ahead, ahead_gated=ahead_gated)
        out = self.inner.attention_o(qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads, wo, residual)
        fused = (f"attention as attention_decode ({num_heads // num_kv_heads} query heads a KV head), "
                 f"then the o projection of each head's output and + residual")
        self.calls.append(KernelCall(self._caches[k_cache.data_ptr()], "attention_o", "attention and o projection",
                                     tuple(wo.shape), ("H", "nH*D"), tuple(out.shape), ("B", "H"),
                                     dtype_name(out.dtype), fused))
        return out

    def attention_block(self, x, wqkv, attn_norm, eps, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads,
                        wo, ahead=None, ahead_gated=False):
        """Recorded as the operations the inner policy runs: the [q; k; v] projection and the
        attention as one launch where it fuses them, then o; else the projection and `attention_o`."""
        operands = (cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
        fuses = getattr(self.inner, "qkv_attention_config", None)
        if fuses is None or fuses(x, wqkv, k_cache, num_heads, num_kv_heads) is None:
            qkv = self.gemv(x, wqkv, norm=attn_norm, eps=eps)
            return self.attention_o(qkv, *operands, wo, x, ahead=ahead, ahead_gated=ahead_gated)
        attended = self.inner.qkv_attention(x, wqkv, attn_norm, eps, *operands)
        fused = (f"RMSNorm of the input, the [q; k; v] projection, then attention as attention_decode "
                 f"({num_heads // num_kv_heads} query heads a KV head), each head's program waiting on its "
                 f"KV head's rows")
        self.calls.append(KernelCall(self._caches[k_cache.data_ptr()], "qkv_attention",
                                     "[q; k; v] projection and attention", tuple(wqkv.shape),
                                     _WEIGHT_ROLES["wqkv"][1], tuple(attended.shape), ("B", "nH*D"),
                                     dtype_name(attended.dtype), fused))
        return self.gemv(attended, wo, residual=x, ahead=ahead, ahead_gated=ahead_gated)

    def greedy_step(self, logits, embed, hidden, tokens, out, position, first_position):
        self.inner.greedy_step(logits, embed, hidden, tokens, out, position, first_position)
        self.calls.append(KernelCall(None, "greedy_step", "next token", tuple(logits.shape), ("B", "V"),
                                     tuple(tokens.shape), ("B", "1"), dtype_name(tokens.dtype),
                                     "argmax, token stored, next input's embedding fetched, position + 1"))


def _operations(device: torch.device):
    """The Triton kernels where they can run (CUDA with Triton installed), else `decode_ops`."""
    from inferlab.fast.engine import triton_available

    if device.type == "cuda" and triton_available():
        from inferlab.fast import kernels as triton_ops

        return triton_ops.Kernels(pdl=False), "Triton kernels (inferlab.fast.kernels)"
    return decode_ops, "their torch specification (inferlab.fast.spec; the Triton kernels need CUDA)"


@torch.inference_mode()
def trace_fast_decode(model, prompt: Prompt, all_layers: bool = False) -> FastTrace:
    """Prefill the prompt, then run and record one greedy decode step of the fast engine."""
    from inferlab.fast.engine import FastLlama

    if bool((prompt.attention_mask == 0).any()):
        raise UsageError("the fast engine needs prompts of equal length (no padding): give one prompt or random ids")
    net = FastLlama(model)
    batch, length = prompt.input_ids.shape
    cache = net.new_cache(batch, length + 1)
    device = prompt.input_ids.device
    first = net(prompt.input_ids, torch.arange(length, device=device), cache, fresh=True)[:, -1].argmax(-1)
    inner, backend = _operations(device)
    ops = RecordingOps(inner, net, cache)
    position = torch.tensor([length], device=device)
    hidden = F.embedding(first, net.embed)
    logits = net.decode_hidden(hidden, position, cache, ops)
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
    out = torch.zeros(batch, 2, dtype=torch.long, device=device)
    ops.greedy_step(logits, net.embed, hidden, tokens, out, position, length)

    ids = torch.cat([prompt.input_ids, first[:, None]], dim=1)
    reference = model(input_ids=ids).logits[:, -1].float()
    dims = {**model_dims(model.config, batch), "S": 1, "T": length + 1, "1": 1}
    num_layers = len(net.layers)
    return FastTrace(
        dims=dims,
        backend=backend,
        calls=tuple(ops.calls),
        num_layers=num_layers,
        layers_shown=tuple(range(num_layers)) if all_layers else (0,),
        next_tokens=tuple(tokens[:, 0].tolist()),
        reference_next_tokens=tuple(reference.argmax(-1).tolist()),
        max_abs_logit_diff=(logits.float() - reference).abs().max().item(),
        max_abs_logit=reference.abs().max().item(),
    )


def mismatches(trace: FastTrace) -> list[KernelCall]:
    """Calls whose observed shapes differ from their symbols (none for a Llama model)."""
    return [c for c in trace.calls
            if evaluate(c.symbols, trace.dims) != c.output or evaluate(c.reads_symbols, trace.dims) != c.reads]


def format_fast_trace(trace: FastTrace) -> str:
    d = trace.dims
    shown = [c for c in trace.calls if c.layer is None or c.layer in trace.layers_shown]
    per_layer = sum(1 for c in trace.calls if c.layer == 0)
    lines = [
        f"B={d['B']}  H={d['H']}  nH={d['nH']}  nKV={d['nKV']}  D={d['D']}  I={d['I']}  V={d['V']}  "
        f"layers={trace.num_layers}",
        f"fast engine decode step (S=1, T={d['T']}): {len(trace.calls)} kernels, {per_layer} per layer, "
        f"run as {trace.backend}",
        "the prompt was prefilled first by FastLlama.forward (torch operations; compiled by the engine on CUDA)",
    ]
    if len(trace.layers_shown) < trace.num_layers:
        lines.append("layer 0 shown; the other layers repeat it (--all-layers shows every one)")
    wrong = {id(c) for c in mismatches(trace)}
    lines += ["", f"{'layer':<6} {'kernel':<17} {'role':<22} {'reads':<20} {'output':<14} {'symbols':<22} {'dtype':<5} fused"]
    for c in shown:
        reads = "[" + ", ".join(map(str, c.reads)) + "]"
        output = "[" + ", ".join(map(str, c.output)) + "]"
        symbols = "[" + ", ".join(c.symbols) + "]" + (" (!)" if id(c) in wrong else "")
        layer = "" if c.layer is None else str(c.layer)
        lines.append(f"{layer:<6} {c.kernel:<17} {c.role:<22} {reads:<20} {output:<14} {symbols:<22} {c.dtype:<5} {c.fused}")
    agree = "the same" if trace.next_tokens == trace.reference_next_tokens else "DIFFERENT"
    lines += [
        "",
        f"greedy next token: {list(trace.next_tokens)}; transformers on the same tokens: "
        f"{list(trace.reference_next_tokens)} ({agree})",
        f"largest logit difference from transformers: {trace.max_abs_logit_diff:.3g} "
        f"(largest |logit| {trace.max_abs_logit:.3g})",
    ]
    return "\n".join(lines)
