"""The fast decode engine: a compact Llama over the same weights, built for decoding.

What makes it fast, each a separate switch (`FastOptions`) so its effect can be measured:

- fused projections: one [q; k; v] matrix and one [gate; up] matrix per layer (fewer, larger reads);
- a static KV cache preallocated for prompt + output, written in place at each position;
- a decode step of hand-fused Triton kernels (`inferlab.fast.kernels`, specified by
  `inferlab.fast.spec`): five per layer, each projection reading its matrix once with the
  RMSNorm, SiLU*up or residual add folded in, attention with RoPE and the cache write in one
  kernel, and for greedy decoding argmax, the next embedding and the position update in one;
  on Hopper the kernels are chained by programmatic dependent launch, so each one starts
  streaming its weights while the previous one finishes;
- without Triton, the step (model, sampling, position update) compiled by ``torch.compile``;
- the prefill (compiled) and the decode step each captured once in a CUDA graph: a step is one
  ``graph.replay()``, with no host work and no synchronization per token.

Prepared once per model, not once per shape: the compiled functions are made once per engine.
The prefill compiles one decoder layer (`LayerStep`) with dynamic shapes, called once per layer:
batch, prompt length and cache length are symbolic, because the cache and its RoPE tables are
arguments (`KVCache`), not module buffers (dynamo specializes the shapes of module buffers), and
one layer compiles in a fraction of the time of all of them unrolled. The static cache is sized
by `cache_length`, a bucket that does not change with every output length. A new (batch, prompt
length, output length) then costs a cache, buffers and two graph captures, not a compile. The
prefill attends over its own keys and values (a fresh request starts at position 0) with one
fused causal kernel, so a larger cache bucket costs it nothing and a long prompt never holds
prompt x prompt scores in memory; the Triton decode attention reads only the positions written.

Sampling stays on the device: greedy is argmax; sampling draws ``u ~ U(0, 1)`` per vocabulary
entry from the caller's generator (outside the graph) and picks ``argmax(p / -log u)``, which is
a draw from ``p`` (the exponential-race form of the multinomial), after the same temperature,
top-k and top-p warpers as everywhere else.

GQA without copying the cache: the g = heads / KV heads query heads that share a KV head are
folded into the query-length axis, so attention runs on [B, kvh, g*S, hd] against [B, kvh, T, hd].
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.decode.loop import DecodeConfig
from inferlab.model import dims
from inferlab.errors import UsageError
from inferlab.decode.prompts import Prompt
from inferlab.decode.sampling import SamplingConfig, warp
from inferlab.fast.spec import rms_normalized, rotate_half


@dataclass(frozen=True)
class FastOptions:
    """Which optimizations are on. None means: on when the device is CUDA.

    `triton`: the decode step runs the hand-fused kernels of `inferlab.fast.kernels` (five per
    layer, see `FastLlama.decode`) instead of a compiled torch step; `compile` then applies to the
    prefill only. Otherwise the decode step is compiled with `compile_mode` (autotuned matrix
    kernels by default: it runs hundreds of times); the prefill runs once per request and uses
    inductor's default mode.
    `pdl`: the Triton kernels use programmatic dependent launch (Hopper and later GPUs): each
    kernel starts reading its weights while the one before it finishes.
    `sdpa=False` writes attention over the cache (the torch decode step) as two matrix products
    and a softmax that inductor can fuse, instead of calling the fused attention kernel (which is
    built for long sequences).
    `prefill_attention`: "flash" runs the prefill's causal attention over the prompt's own keys as
    one fused kernel (`scaled_dot_product_attention`, is_causal, GQA); "matmul" as two matrix
    products and a masked softmax, which materializes prompt x prompt scores per head.
    `prefill_compile`: "layer" compiles one decoder layer and calls it per layer (a compile of one
    layer's size); "model" compiles the whole prefill as one graph (every layer unrolled, so
    inductor may fuse across layer boundaries, for a longer compile). Both with dynamic shapes.
    `prefill_cache_write`: how the prefill stores the prompt's keys and values in the static cache:
    "slice" copies them into its first S positions (a prefill starts at position 0); "index"
    scatters them with `index_copy_` at their positions, as a decode step does (inductor compiles
    that into a slow scatter; both are timed in docs/perf/h100/targets-3.md).
    `prefill_head`: with the Triton kernels and greedy decoding, "kernels" ends the prefill as a
    decode step ends: the LM head's kernel (the final norm fused) and the greedy step kernel
    (argmax, the next embedding, the token stored, the position advanced); "torch" runs the norm,
    the LM head, the argmax and the bookkeeping as torch operations (about ten kernels instead of
    two).
    """

    compile: bool | None = None
    graphs: bool | None = None
    triton: bool | None = None
    pdl: bool | None = None
    compile_mode: str = "max-autotune-no-cudagraphs"
    coordinate_descent: bool = True
    sdpa: bool = False
    prefill_attention: str = "flash"
    prefill_compile: str = "layer"
    prefill_cache_write: str = "slice"
    prefill_head: str = "kernels"
    launch: object | None = None  # a `kernels.LaunchPolicy` for the Triton kernels; None: the measured default
    dynamic_prefill: bool = True  # one prefill compile for every prompt and cache length

    def __post_init__(self) -> None:
        if self.prefill_attention not in ("flash", "matmul"):
            raise UsageError(f"prefill_attention must be 'flash' or 'matmul', not {self.prefill_attention!r}")
        if self.prefill_compile not in ("layer", "model"):
            raise UsageError(f"prefill_compile must be 'layer' or 'model', not {self.prefill_compile!r}")
        if self.prefill_cache_write not in ("slice", "index"):
            raise UsageError(f"prefill_cache_write must be 'slice' or 'index', not {self.prefill_cache_write!r}")
        if self.prefill_head not in ("kernels", "torch"):
            raise UsageError(f"prefill_head must be 'kernels' or 'torch', not {self.prefill_head!r}")

    def resolved(self, device: torch.device) -> "FastOptions":
        cuda = device.type == "cuda"
        triton = (cuda and triton_available()) if self.triton is None else self.triton
        hopper = cuda and torch.cuda.get_device_capability(device)[0] >= 9
        return replace(
            self,
            compile=cuda if self.compile is None else self.compile,
            graphs=cuda if self.graphs is None else self.graphs,
            triton=triton,
            pdl=triton and hopper and self.pdl is not False,
        )


def triton_available() -> bool:
    """Whether Triton can be imported (it ships with CUDA builds of torch, not with CPU ones)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def compile_options(options: FastOptions) -> dict:
    """Inductor options for the decode step: `compile_mode`'s, plus coordinate-descent tuning of
    the launch shape of inductor's own kernels (norms, GEMV epilogues). Passed per compile, so
    no global inductor setting changes."""
    from torch._inductor import list_mode_options

    return {**list_mode_options(options.compile_mode), "coordinate_descent_tuning": options.coordinate_descent}


MIN_CACHE_LENGTH = 256


def cache_length(needed: int, max_context: int | None) -> int:
    """Positions of the static cache for a request needing `needed`: the next power of two, at
    least `MIN_CACHE_LENGTH`, capped at the model's context (never below `needed`), so requests
    that differ a little share one cache shape."""
    length = max(MIN_CACHE_LENGTH, 1 << max(needed - 1, 0).bit_length())
    if max_context:
        length = min(length, max_context)
    return max(length, needed)


def symbolic_shapes(compiled, static: list):
    """`compiled` (a function compiled with dynamic=True) called so that it compiles once for
    batch 1 and once for all larger batches, whatever the prompt and cache lengths: the `static`
    tensors (the weights) keep their sizes, and no two other sizes are made one symbol because
    they happened to be equal at the first call (a prompt of 64 tokens and a head dimension of
    64), which would recompile the next shape. (Size 1 is specialized as always in torch.)"""
    from torch.fx.experimental import _config as shape_config

    for tensor in static:
        torch._dynamo.mark_static(tensor)
    return shape_config.patch(use_duck_shape=False)(compiled)


def check_supported(model) -> None:
    """UsageError unless `model` is a Llama-architecture causal LM this engine can rebuild."""
    config = model.config
    if getattr(config, "model_type", None) != "llama":
        raise UsageError(f"the fast engine supports Llama-architecture models, not {config.model_type!r}: use --engine eager or hf")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise UsageError("the fast engine supports Llama models without projection biases: use --engine eager or hf")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UsageError(f"the fast engine supports SiLU MLPs, not {config.hidden_act!r}: use --engine eager or hf")


class FastLayer(nn.Module):
    """One decoder layer's weights, fused: wqkv [(nh + 2 kvh) hd, H], w13 [2 I, H]."""

    def __init__(self, layer) -> None:
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        with torch.no_grad():
            wqkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], dim=0)
            w13 = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0)
        self.register_buffer("wqkv", wqkv, persistent=False)
        self.register_buffer("wo", attn.o_proj.weight.detach(), persistent=False)
        self.register_buffer("w13", w13, persistent=False)
        self.register_buffer("w2", mlp.down_proj.weight.detach(), persistent=False)
        self.register_buffer("attn_norm", layer.input_layernorm.weight.detach(), persistent=False)
        self.register_buffer("ffn_norm", layer.post_attention_layernorm.weight.detach(), persistent=False)

    def weights(self) -> tuple:
        """(wqkv, wo, w13, w2, attn_norm, ffn_norm), in `LayerStep`'s order."""
        return self.wqkv, self.wo, self.w13, self.w2, self.attn_norm, self.ffn_norm


def stack_layers(layers: nn.ModuleList) -> tuple[torch.Tensor, ...]:
    """The layers' weights, one [L, ...] tensor a kind in `FastLayer.weights`' order; each layer's
    buffers become views of them. The fused [q; k; v] and [gate; up] are copies either way; o,
    down and the norms, which the unstacked layers share with the model, are copied once more."""
    stacks = []
    for name in ("wqkv", "wo", "w13", "w2", "attn_norm", "ffn_norm"):
        stack = torch.stack([getattr(layer, name) for layer in layers])
        for index, layer in enumerate(layers):
            setattr(layer, name, stack[index])
        stacks.append(stack)
    return tuple(stacks)


@dataclass(frozen=True)
class KVCache:
    """One shape's static KV cache, k and v [L, B, kvh, T, hd], and its RoPE tables cos, sin [T, hd]."""

    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[3]


class LayerStep(nn.Module):
    """One decoder layer over a cache, its weights passed in: compiled once, called for every layer.

    It holds no tensors, only the layer's constants, so one compiled function serves all layers
    (same shapes) and every cache (sizes symbolic).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, sdpa: bool,
                 prefill_flash: bool = True, slice_write: bool = False) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.eps, self.sdpa = num_heads, num_kv_heads, head_dim, eps, sdpa
        self.prefill_flash, self.slice_write = prefill_flash, slice_write

    def forward(self, x, weights, k_cache, v_cache, cos, sin, positions, fresh: bool) -> torch.Tensor:
        """x [B, S, H] at positions [S] -> [B, S, H]; writes this layer's K/V [B, kvh, T, hd] at those positions.

        `fresh`: positions are 0..S-1 of a new request, so attention reads the S new keys and values
        (causal) instead of the cache; otherwise it reads the whole cache, masked past each position.
        """
        wqkv, wo, w13, w2, attn_norm, ffn_norm = weights
        x = x + self.attention(rms_normalized(x, attn_norm, self.eps), wqkv, wo, k_cache, v_cache, cos, sin,
                               positions, fresh)
        gate, up = F.linear(rms_normalized(x, ffn_norm, self.eps), w13).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w2)

    def attention(self, x, wqkv, wo, k_cache, v_cache, cos, sin, positions, fresh: bool) -> torch.Tensor:
        B, S, _ = x.shape
        nh, kvh, hd = self.num_heads, self.num_kv_heads, self.head_dim
        g = nh // kvh
        q, k, v = F.linear(x, wqkv).split([nh * hd, kvh * hd, kvh * hd], dim=-1)
        q = q.view(B, S, nh, hd).transpose(1, 2)
        k = k.view(B, S, kvh, hd).transpose(1, 2)
        v = v.view(B, S, kvh, hd).transpose(1, 2)
        cos, sin = cos[positions], sin[positions]  # [S, hd]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if fresh and self.slice_write:  # positions 0..S-1: a copy into the cache's first S positions
            k_cache[:, :, :S].copy_(k)
            v_cache[:, :, :S].copy_(v)
        else:
            k_cache.index_copy_(2, positions, k)
            v_cache.index_copy_(2, positions, v)
        if fresh and self.prefill_flash:  # one fused causal kernel; the query heads of a group share K/V
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=hd**-0.5, enable_gqa=True)
            return F.linear(out.transpose(1, 2).reshape(B, S, nh * hd), wo)
        if fresh:
            keys, values, key_positions = k, v, positions
        else:
            keys, values = k_cache, v_cache
            key_positions = torch.arange(k_cache.shape[2], device=positions.device)
        # Fold the g query heads of each KV head into the query axis: [B, kvh, g*S, hd].
        q = q.reshape(B, kvh, g * S, hd)
        mask = (positions[:, None] >= key_positions[None, :]).repeat(g, 1)  # [g*S, T]
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=hd**-0.5)
        else:
            scores = (q @ keys.transpose(-1, -2)).float() * hd**-0.5  # [B, kvh, g*S, T]
            probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(values.dtype)
            out = probs @ values
        out = out.view(B, nh, S, hd).transpose(1, 2).reshape(B, S, nh * hd)
        return F.linear(out, wo)


class FastLlama(nn.Module):
    """A Llama forward pass over a static KV cache: tokens [B, S] at positions [S] -> logits [B, 1, V]."""

    def __init__(self, hf_model, sdpa: bool = False, prefill_flash: bool = True, stacked: bool = False,
                 slice_write: bool = False) -> None:
        super().__init__()
        check_supported(hf_model)
        config = hf_model.config
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = dims.kv_heads(config)
        self.head_dim = dims.head_dim(config)
        self.eps = config.rms_norm_eps
        self.step = LayerStep(self.num_heads, self.num_kv_heads, self.head_dim, self.eps, sdpa, prefill_flash, slice_write)
        self.layers = nn.ModuleList(FastLayer(layer) for layer in hf_model.model.layers)
        # `stacked`: each kind of weight as one [L, ...] tensor, for the kernel that runs every layer
        self.stacks = stack_layers(self.layers) if stacked else None
        self.register_buffer("embed", hf_model.get_input_embeddings().weight.detach(), persistent=False)
        self.register_buffer("norm", hf_model.model.norm.weight.detach(), persistent=False)
        self.register_buffer("lm_head", hf_model.get_output_embeddings().weight.detach(), persistent=False)
        self._rotary = hf_model.model.rotary_emb

    def new_cache(self, batch_size: int, max_seq: int) -> KVCache:
        """A zeroed K/V cache [L, B, kvh, max_seq, hd] and the RoPE tables for positions [0, max_seq)."""
        device, dtype = self.embed.device, self.embed.dtype
        shape = (len(self.layers), batch_size, self.num_kv_heads, max_seq, self.head_dim)
        positions = torch.arange(max_seq, device=device)[None]
        with torch.no_grad():
            # transformers' own rotary module, so every RoPE variant it knows comes out identical.
            cos, sin = self._rotary(self.embed[:1, None].expand(1, max_seq, -1), positions)
        return KVCache(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype),
                       cos[0], sin[0])

    def decode(self, tokens: torch.Tensor, position: torch.Tensor, cache: KVCache, ops) -> torch.Tensor:
        """One token per row: tokens [B, 1] at `position` [1] -> logits [B, V] (float32).

        `ops` is `inferlab.fast.kernels` (the GPU kernels) or `inferlab.fast.spec` (the same
        operations in torch).
        """
        return self.decode_hidden(F.embedding(tokens[:, 0], self.embed), position, cache, ops)

    def decode_hidden(self, x: torch.Tensor, position: torch.Tensor, cache: KVCache, ops) -> torch.Tensor:
        """`decode` from the embedded tokens x [B, H]; each line below is one kernel, but for
        `attention_block`: the [q; k; v] projection, the attention and o, as two to four kernels by
        the launch policy; with stacked weights at batch 1, `decode_layers` runs every layer in one)."""
        if self.stacks is not None and x.shape[0] == 1:
            x = ops.decode_layers(x, self.stacks, cache.cos, cache.sin, position, cache.k, cache.v, self.num_heads,
                                  self.num_kv_heads, self.eps)
            return ops.gemv(x, self.lm_head, norm=self.norm, eps=self.eps, out_dtype=torch.float32)
        # `ahead`: the weight the next weight-reading kernel reads, a hint for L2 (LaunchPolicy.l2_ahead)
        for index, layer in enumerate(self.layers):
            after = self.layers[index + 1].wqkv if index + 1 < len(self.layers) else self.lm_head
            x = ops.attention_block(x, layer.wqkv, layer.attn_norm, self.eps, cache.cos, cache.sin, position,
                                    cache.k[index], cache.v[index], self.num_heads, self.num_kv_heads, layer.wo,
                                    ahead=layer.w13, ahead_gated=True)
            h = ops.gemv(x, layer.w13, norm=layer.ffn_norm, eps=self.eps, gated=True, ahead=layer.w2)
            x = ops.gemv(h, layer.w2, residual=x, ahead=after)
        return ops.gemv(x, self.lm_head, norm=self.norm, eps=self.eps, out_dtype=torch.float32,
                        ahead=self.layers[0].wqkv)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, fresh: bool = False,
                step=None, head: bool = True) -> torch.Tensor:
        """tokens [B, S] at positions [S] -> logits [B, 1, V] of the last position (float32).

        `fresh`: the positions are 0..S-1 of a new request (a prefill). `step` runs one layer
        (default `self.step`; the engine passes it compiled). `head=False`: the last position's
        hidden state [B, H] before the final norm instead of logits.
        """
        step = self.step if step is None else step
        x = F.embedding(tokens, self.embed)
        for index, layer in enumerate(self.layers):
            x = step(x, layer.weights(), cache.k[index], cache.v[index], cache.cos, cache.sin, positions, fresh)
        if not head:
            return x[:, -1].contiguous()
        x = rms_normalized(x[:, -1:], self.norm, self.eps)
        return F.linear(x, self.lm_head).float()


def pick(logits: torch.Tensor, sampling: SamplingConfig, uniform: torch.Tensor | None) -> torch.Tensor:
    """Token ids [B] from logits [B, V]: argmax, or argmax(p / -log u), a draw from the warped p."""
    if sampling.greedy:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(warp(logits, sampling), dim=-1)
    exponential = -torch.log(uniform.clamp_min(1e-20))
    return torch.argmax(probs / exponential, dim=-1)


def sample_step(logits: torch.Tensor, sampling: SamplingConfig, uniform: torch.Tensor, embed: torch.Tensor,
                tokens: torch.Tensor, out: torch.Tensor, hidden: torch.Tensor | None, position: torch.Tensor,
                first_position: torch.Tensor) -> None:
    """The end of a sampled decode step, in place: the token `pick`s from logits [B, V] goes to
    tokens [B, 1] and to column `position - first_position + 1` of out; its embedding to hidden
    [B, H] (when the next step starts from it); `position` advances by one."""
    token = pick(logits, sampling, uniform)
    tokens.copy_(token[:, None])
    out.index_copy_(1, position - first_position + 1, token[:, None])
    if hidden is not None:
        hidden.copy_(F.embedding(token, embed))
    position.add_(1)


# What `FastEngine.prepare` builds for one shape; kept per shape, so going back to a shape
# prepared before (a sweep interleaves its configurations) restores it instead of rebuilding it.
SHAPE_STATE = ("cache", "sampling", "prompt_ids", "prompt_positions", "tokens", "hidden", "position", "first_position", "out",
               "uniform", "last_prompt_position", "_kernel_head",
               "prompt_length", "new_tokens", "kernels", "_sample_kernel", "_prefill", "_decode", "_prefill_graph",
               "_decode_graph")


class FastEngine:
    """Static cache + fused, compiled step + CUDA graphs. `prepare` compiles and captures; `run` only replays.

    Each shape (batch, prompt length, output length, sampling) is prepared once and kept with its
    own cache, buffers and graphs (the weights are shared): switching back to it costs nothing.
    """

    name = "fast"

    def __init__(self, model, options: FastOptions | None = None) -> None:
        check_supported(model)
        self.hf_model = model
        self.device = next(model.parameters()).device
        self.options = (options or FastOptions()).resolved(self.device)
        if self.options.graphs and self.device.type != "cuda":
            raise UsageError("CUDA graphs need a CUDA device: run the fast engine on CPU with graphs off")
        if self.options.triton and self.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("the Triton decode kernels need a CUDA device: run the fast engine on CPU with triton off")
        self.net: FastLlama | None = None
        self._compiled = None  # (prefill, decode, sample step): made once per engine, shared by every shape
        self._key = None
        self._shapes: dict = {}  # key -> engine state of every shape prepared

    def describe(self) -> str:
        o = self.options
        if o.triton:
            step = "triton kernels" + (" with PDL" if o.pdl else "") + (", prefill compiled" if o.compile else "")
        else:
            step = f"compile={'on, ' + o.compile_mode if o.compile else 'off'}"
        return f"fast ({step}, cuda graphs={'on' if o.graphs else 'off'})"

    @torch.inference_mode()
    def prepare(self, prompt: Prompt, config: DecodeConfig) -> None:
        """Build the cache and buffers for this shape, compile, warm up and capture the graphs."""
        key = (prompt.batch_size, prompt.length, config.max_new_tokens, config.sampling)
        if key == self._key:
            return
        if key in self._shapes:
            self._restore(key)
            return
        if bool((prompt.attention_mask == 0).any()):
            raise UsageError("the fast engine needs prompts of equal length (no padding): use --engine eager or hf")
        B, S, N = key[:3]
        if self.net is None:
            launch = self.options.launch
            self.net = FastLlama(self.hf_model, sdpa=self.options.sdpa,
                                 prefill_flash=self.options.prefill_attention == "flash",
                                 slice_write=self.options.prefill_cache_write == "slice",
                                 stacked=self.options.triton and launch is not None and launch.persistent)
        positions = cache_length(S + N, getattr(self.hf_model.config, "max_position_embeddings", None))
        self.cache = self.net.new_cache(B, positions)
        vocab = self.net.embed.shape[0]
        dev = self.device
        self.sampling = config.sampling
        self.prompt_ids = torch.zeros(B, S, dtype=torch.long, device=dev)
        self.prompt_positions = torch.arange(S, device=dev)
        self.tokens = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(B, self.net.embed.shape[1], dtype=self.net.embed.dtype, device=dev)
        self.position = torch.zeros(1, dtype=torch.long, device=dev)
        # the prompt length as a tensor: compiled code that read an int (or a size) would be specialized to it
        self.first_position = torch.full((1,), S, dtype=torch.long, device=dev)
        self.last_prompt_position = torch.full((1,), S - 1, dtype=torch.long, device=dev)
        # sized by the cache bucket, not by N, so compiled code is not specialized to N
        self.out = torch.zeros(B, positions, dtype=torch.long, device=dev)
        self.uniform = None if config.sampling.greedy else torch.rand(B, vocab, device=dev)
        self.prompt_length = S
        self.new_tokens = N
        self.kernels = None  # the decode step's operations when it runs the Triton kernels
        if self.options.triton:
            from inferlab.fast import kernels as triton_ops

            self.kernels = triton_ops.Kernels(pdl=self.options.pdl, policy=self.options.launch or triton_ops.DEFAULT_POLICY)
        # a sampled step ends in the policy's sampling kernel where it takes these rows of logits
        self._sample_kernel = (self.kernels is not None and not config.sampling.greedy
                               and self.kernels.sample_fits(B, vocab, dev))

        # a greedy prefill ends in the decode step's LM head and greedy step kernels when asked
        self._kernel_head = (self.kernels is not None and config.sampling.greedy
                             and self.options.prefill_head == "kernels")

        if self._compiled is None:
            self._compiled = self._compile()
        self._prefill_net, self._decode, self._sample_step = self._compiled
        self._prefill = self._prefill_body
        self._prefill_graph = self._decode_graph = None
        if self.options.graphs:
            self._capture()
        self._key = key
        self._shapes[key] = {name: getattr(self, name) for name in SHAPE_STATE}

    def _restore(self, key) -> None:
        for name, value in self._shapes[key].items():
            setattr(self, name, value)
        self._key = key

    @property
    def prepared_shapes(self) -> tuple:
        """The (batch, prompt length, output length, sampling) of every shape prepared so far."""
        return tuple(self._shapes)

    def _compile(self) -> tuple:
        """The prefill's forward pass, the decode function and the end of a sampled step, compiled
        as the options say; each shape's tensors are inputs.

        With the Triton kernels, a sampled step ends in `sample_step` (temperature, top-k, top-p,
        the exponential race and the bookkeeping): compiled, its elementwise work runs as a few
        fused kernels instead of one kernel per torch operation."""
        net, decode, sample = self.net, self._decode_body, sample_step
        prefill = functools.partial(net, fresh=True)
        if self.options.compile:
            dynamic = self.options.dynamic_prefill
            if self.options.prefill_compile == "model":
                prefill = functools.partial(torch.compile(net, fullgraph=True, dynamic=dynamic), fresh=True)
            else:
                step = torch.compile(net.step, fullgraph=True, dynamic=dynamic)
                prefill = functools.partial(net, fresh=True, step=step)
            if dynamic:
                prefill = symbolic_shapes(prefill, [t for layer in net.layers for t in layer.weights()])
            if self.options.triton:
                sample = torch.compile(sample, fullgraph=True, dynamic=False)
            else:
                decode = torch.compile(decode, options=compile_options(self.options), fullgraph=True, dynamic=False)
        return prefill, decode, sample

    def _prefill_body(self) -> None:
        if self._kernel_head:
            net = self.net
            x = self._prefill_net(self.prompt_ids, self.prompt_positions, self.cache, head=False)
            logits = self.kernels.gemv(x, net.lm_head, norm=net.norm, eps=net.eps, out_dtype=torch.float32)
            # at the prompt's last position the step kernel stores its token in column 0 and advances to S
            self.position.copy_(self.last_prompt_position)
            self.kernels.greedy_step(logits, net.embed, self.hidden, self.tokens, self.out, self.position,
                                     self.prompt_length)
            return
        logits = self._prefill_net(self.prompt_ids, self.prompt_positions, self.cache)[:, -1]
        first = pick(logits, self.sampling, self.uniform)
        self.tokens.copy_(first[:, None])
        self.out[:, 0].copy_(first)
        if self.options.triton:
            self.hidden.copy_(F.embedding(first, self.net.embed))
        self.position.copy_(self.first_position)

    def _decode_body(self) -> None:
        if self.kernels is None:
            logits = self.net(self.tokens, self.position, self.cache)[:, -1]
        else:
            logits = self.net.decode_hidden(self.hidden, self.position, self.cache, self.kernels)
            if self.sampling.greedy:  # argmax, next embedding and bookkeeping: one kernel
                self.kernels.greedy_step(logits, self.net.embed, self.hidden, self.tokens, self.out, self.position,
                                         self.prompt_length)
                return
            if self._sample_kernel:  # the thresholds, the draw and the bookkeeping: one kernel
                self.kernels.sample_step(logits, self.sampling, self.uniform, self.net.embed, self.hidden, self.tokens,
                                         self.out, self.position, self.prompt_length)
                return
        self._sample_step(logits, self.sampling, self.uniform, self.net.embed, self.tokens, self.out,
                          None if self.kernels is None else self.hidden, self.position, self.first_position)

    def _capture(self) -> None:
        # Warm up on a side stream (compilation and autotuning happen here), then capture.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._prefill()
                self._decode()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        self._prefill_graph, self._decode_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._prefill_graph):
            self._prefill()
        with torch.cuda.graph(self._decode_graph, pool=self._prefill_graph.pool()):
            self._decode()
        torch.cuda.synchronize(self.device)

    def _draw(self, generator: torch.Generator | None) -> None:
        if self.uniform is not None:
            self.uniform.uniform_(generator=generator)

    @torch.inference_mode()
    def run(self, prompt: Prompt, config: DecodeConfig, generator: torch.Generator | None, clock) -> torch.Tensor:
        """Generate `config.max_new_tokens` tokens (EOS is not checked: fixed-length decoding)."""
        self.prepare(prompt, config)
        clock.start()
        self.prompt_ids.copy_(prompt.input_ids)
        self._draw(generator)
        self._step(self._prefill_graph, self._prefill)
        clock.mark()
        for _ in range(self.new_tokens - 1):
            self._draw(generator)
            self._step(self._decode_graph, self._decode)
            clock.mark()
        return self.out[:, : self.new_tokens].clone()

    @staticmethod
    def _step(graph, function) -> None:
        if graph is not None:
            graph.replay()
        else:
            function()
