"""The fused operations of one Llama decode step, in plain torch: the specification that the
Triton kernels in `inferlab.fast.kernels` implement, and the CPU path of the fast engine.

A decode layer is five of them (hidden x [M, H], M = batch, one new token each):

    qkv  = gemv(x, wqkv, norm=attn_norm)              # RMSNorm folded into the projection
    attn = attention_decode(qkv, cos, sin, position, k_cache, v_cache, heads)
    x    = gemv(attn, wo, residual=x)                  # residual add folded in
    h    = gemv(x, w13, norm=ffn_norm, gated=True)     # silu(gate) * up, one read of [gate; up]
    x    = gemv(h, w2, residual=x)

`attention_o` is the second and third lines as one operation (`x = attention_o(qkv, ..., wo,
residual=x)`, one kernel on the GPU where the launch policy fuses them), `qkv_attention` the first
two (one kernel where the policy fuses them), and `attention_block` the first three, which the
engine calls: the kernels pick how to split it. The step ends with
`gemv(x, lm_head, norm=final_norm)` and, when greedy, `greedy_step`
(argmax, the next input's embedding and the position update in one operation).

Rounding follows transformers' Llama in the weights' dtype: RMSNorm computes in float32, rounds
the normalized input, then multiplies by its weight in the model's dtype; each projection
accumulates in float32 and rounds once; the residual add, SiLU and the product with `up` each
round to the model's dtype. RoPE and attention compute in float32 and round their outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_normalized(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)), x [M, K], rounded like transformers' LlamaRMSNorm."""
    normalized = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * normalized


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out_dtype: torch.dtype | None = None,
    ahead: torch.Tensor | None = None,
    ahead_gated: bool = False,
) -> torch.Tensor:
    """x [M, K] @ weight[N', K]^T -> [M, N] in `out_dtype` (default x's dtype).

    norm: RMSNorm x with this weight first. gated: weight is [gate; up] ([2N, K]) and the result
    is silu(gate) * up. residual [M, N]: added to the result. ahead, ahead_gated: the weight a
    later kernel reads, which the GPU kernels may ask L2 for; no effect on the result.
    """
    dtype = weight.dtype
    if norm is not None:
        x = rms_normalized(x, norm, eps)
    y = (x.float() @ weight.float().T).to(dtype)
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    if residual is not None:
        y = residual + y
    return y.to(out_dtype or x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last axis: transformers' half-split RoPE layout."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., D] rotated by cos/sin [D] (transformers' half-split layout), in float32."""
    return x.float() * cos.float() + rotate_half(x).float() * sin.float()


def attention_decode(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    ahead: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token's attention: qkv [M, (nh + 2 kvh) hd] at `position` [1] -> [M, nh hd].

    Applies RoPE to q and k, writes k and v into the caches [M, kvh, T, hd] at `position`, and
    attends over positions [0, position] (GQA: query head h reads KV head h // (nh / kvh)).
    ahead: the o projection's weight, which the GPU kernel may ask L2 for; no effect on the result.
    """
    M = qkv.shape[0]
    hd = k_cache.shape[-1]
    dtype = k_cache.dtype
    q, k, v = qkv.split([num_heads * hd, num_kv_heads * hd, num_kv_heads * hd], dim=-1)
    c, s = cos[position[0]], sin[position[0]]
    q = rope(q.reshape(M, num_heads, hd), c, s).to(dtype)
    k = rope(k.reshape(M, num_kv_heads, hd), c, s).to(dtype)
    k_cache.index_copy_(2, position, k[:, :, None])
    v_cache.index_copy_(2, position, v.reshape(M, num_kv_heads, 1, hd).to(dtype))
    length = int(position[0]) + 1
    keys, values = k_cache[:, :, :length].float(), v_cache[:, :, :length].float()
    group = num_heads // num_kv_heads
    q = q.float().reshape(M, num_kv_heads, group, hd)
    probs = torch.softmax(q @ keys.transpose(-1, -2) * hd**-0.5, dim=-1)  # [M, kvh, g, T]
    return (probs @ values).reshape(M, num_heads * hd).to(dtype)


def attention_o(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    wo: torch.Tensor,
    residual: torch.Tensor,
    ahead: torch.Tensor | None = None,
    ahead_gated: bool = False,
) -> torch.Tensor:
    """A layer's attention and o projection: residual + `gemv`(`attention_decode`(...), wo) [M, H],
    the cache written as `attention_decode` writes it. ahead, ahead_gated: the weight a later
    kernel reads (see `gemv`); no effect on the result."""
    attended = attention_decode(qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
    return gemv(attended, wo, residual=residual)


def qkv_attention(
    x: torch.Tensor,
    wqkv: torch.Tensor,
    attn_norm: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> torch.Tensor:
    """The [q; k; v] projection and the attention: `attention_decode`(`gemv`(x, wqkv, norm=attn_norm)),
    x [M, H] -> [M, nh hd], the cache written as `attention_decode` writes it."""
    qkv = gemv(x, wqkv, norm=attn_norm, eps=eps)
    return attention_decode(qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)


def attention_block(
    x: torch.Tensor,
    wqkv: torch.Tensor,
    attn_norm: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    wo: torch.Tensor,
    ahead: torch.Tensor | None = None,
    ahead_gated: bool = False,
) -> torch.Tensor:
    """A layer's first half: x + o(attention([q; k; v](RMSNorm(x)))) [M, H], the first three lines
    above. ahead, ahead_gated: the weight a later kernel reads (see `gemv`); no effect on the result."""
    attended = qkv_attention(x, wqkv, attn_norm, eps, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
    return gemv(attended, wo, residual=x)


def decode_layers(
    hidden: torch.Tensor,
    stacks: tuple[torch.Tensor, ...],
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
) -> torch.Tensor:
    """Every layer's five operations above, in turn: hidden [M, H] -> the residual stream after
    the last layer, before the final norm.

    stacks: (wqkv, wo, w13, w2, attn_norm, ffn_norm), each [L, ...], layer l's weights at index l;
    k_cache, v_cache [L, M, kvh, T, hd]. The operation `inferlab.fast.kernels.decode_layers` runs
    in one kernel."""
    x = hidden
    for index, (wqkv, wo, w13, w2, attn_norm, ffn_norm) in enumerate(zip(*stacks)):
        qkv = gemv(x, wqkv, norm=attn_norm, eps=eps)
        attn = attention_decode(qkv, cos, sin, position, k_cache[index], v_cache[index], num_heads, num_kv_heads)
        x = gemv(attn, wo, residual=x)
        x = gemv(gemv(x, w13, norm=ffn_norm, eps=eps, gated=True), w2, residual=x)
    return x


def greedy_step(
    logits: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    position: torch.Tensor,
    first_position: int,
) -> None:
    """The end of a greedy decode step, in place: logits [M, V] at `position` [1].

    The next token (argmax, the first of equal maxima) goes to tokens [M, 1] and to column
    `position - first_position + 1` of out [M, N]; its embedding row goes to hidden [M, H],
    the next step's input; `position` advances by one.
    """
    token = logits.argmax(dim=-1)
    tokens.copy_(token[:, None])
    out.index_copy_(1, position - first_position + 1, token[:, None])
    hidden.copy_(F.embedding(token, embed))
    position.add_(1)
