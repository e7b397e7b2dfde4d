"""Decode attention and the o projection in one kernel: a layer's attention, its product with
o's weight and the residual add, without the attention output's round trip through memory or
the kernel boundary between them.

One program per (query head h, block of BLOCK_N of o's output rows): it attends over the cache
for head h (as `attention._attention_decode_kernel` does without ranges), multiplies the head's
output into its block of o's weight columns [BLOCK_N, HD], and stores that float32 partial sum.
The last of a block's NH programs to arrive adds the NH partial sums in head order (the same
bits whatever the arrival order), rounds, adds the residual and resets the block's arrival
count to 0 for the next launch.

Before waiting on the previous kernel a program loads what no kernel of the step writes: its
slice of o's weight, the position, the RoPE tables and the first BLOCK_T cached positions (see
`attention.attention_decode` for the contract that makes the cache rows safe to read there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.fast.kernels.attention import _attend, _attend_cached, _early_reads, _rope
from inferlab.fast.kernels.launch import _launch_options, _use_pdl, kept


@triton.jit
def _attention_o_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, wo_ptr, res_ptr, out_ptr, part_ptr, arrivals_ptr,
    stride_cm, stride_ch, stride_ct, scale,
    N: tl.constexpr, NH: tl.constexpr, NH_PAD: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
):
    """out[m, n] = residual[m, n] + sum over heads h of o[n, h] . attention_h(m) for one (h, block)."""
    pid = tl.program_id(0)
    m = tl.program_id(1)
    h = pid % NH  # the heads of one block are neighbours: those of a KV head share its cache in L2
    block = pid // NH
    BLOCKS: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    G: tl.constexpr = NH // KVH
    kv = h // G
    HALF: tl.constexpr = HD // 2
    dtype = k_ptr.dtype.element_ty
    d = tl.arange(0, HD)
    partner = (d + HALF) % HD
    offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w = tl.load(wo_ptr + offs_n.to(tl.int64)[:, None] * (NH * HD) + h * HD + d[None, :], mask=mask_n[:, None],
                other=0.0)  # [BLOCK_N, HD]: a weight, never written
    pos = tl.load(pos_ptr)
    cache_at = m * stride_cm + kv * stride_ch
    cos, sin, keys, values, valid = _early_reads(cos_ptr, sin_ptr, k_ptr, v_ptr, pos, cache_at, stride_ct, d, 0, pos,
                                                 HD, BLOCK_T)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the q, k, v of this token and the residual come from earlier kernels
    row = qkv_ptr + m * (NH + 2 * KVH) * HD
    q_at = row + h * HD
    q = _rope(tl.load(q_at + d).to(tl.float32), tl.load(q_at + partner).to(tl.float32), cos, sin, d, HALF)
    q = q.to(dtype).to(tl.float32)
    k_at = row + (NH + kv) * HD
    k = _rope(tl.load(k_at + d).to(tl.float32), tl.load(k_at + partner).to(tl.float32), cos, sin, d, HALF).to(dtype)
    v = tl.load(row + (NH + KVH + kv) * HD + d).to(dtype)
    if (h % G == 0) & (block == 0):  # one writer per KV head; readers take the new token from registers
        tl.store(k_ptr + cache_at + pos * stride_ct + d, k)
        tl.store(v_ptr + cache_at + pos * stride_ct + d, v)
    best = tl.sum(q * k.to(tl.float32), axis=0) * scale  # online softmax from the new token's own score
    total = best * 0.0 + 1.0
    acc = v.to(tl.float32)
    best, total, acc = _attend(keys, values, valid, q, scale, best, total, acc)
    after = pos * 0 + BLOCK_T  # a tensor: the loop's counter must not change type
    best, total, acc = _attend_cached(k_ptr, v_ptr, cache_at, stride_ct, d, q, scale, best, total, acc, after, pos,
                                      BLOCK_T)
    attended = (acc / total).to(dtype).to(tl.float32)  # the head's output, rounded as o's input is
    partial = tl.sum(w.to(tl.float32) * attended[None, :], axis=1)  # [BLOCK_N]
    tl.store(part_ptr + (m * NH + h) * N + offs_n, partial, mask=mask_n)
    tl.debug_barrier()  # every thread's partial sums are written before the count says so
    if tl.atomic_add(arrivals_ptr + m * BLOCKS + block, 1, sem="acq_rel") == NH - 1:
        tl.debug_barrier()
        heads = tl.arange(0, NH_PAD)
        parts = tl.load(part_ptr + (m * NH + heads[:, None]) * N + offs_n[None, :],
                        mask=(heads[:, None] < NH) & mask_n[None, :], other=0.0, cache_modifier=".cg")
        y = tl.sum(parts, axis=0).to(dtype)
        r = tl.load(res_ptr + m * N + offs_n, mask=mask_n, other=0.0)
        tl.store(out_ptr + m * N + offs_n, (r.to(tl.float32) + y.to(tl.float32)).to(dtype), mask=mask_n)
        tl.atomic_xchg(arrivals_ptr + m * BLOCKS + block, 0)


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
    *,
    block_n: int = 256,
    block_t: int = 256,
    num_warps: int = 8,
    registers: int = 0,
    pdl: bool | None = None,
) -> torch.Tensor:
    """Same contract as `inferlab.fast.spec.attention_o`: residual + o(attention(qkv)) [M, H].

    `block_t`: at most this many cached positions are read before the wait (fewer where the
    cache's length, rounded up to a power of two, is less: then all of it); positions past them
    are read after, that many at a time.
    `block_n`: o's output rows a program. `num_warps`: warps a program. `registers` > 0: at most
    that many registers a thread (ptxas's maxnreg), so that more programs fit on an SM.
    """
    M, hd = qkv.shape[0], k_cache.shape[-1]
    N = wo.shape[0]
    assert wo.shape[1] == num_heads * hd and wo.is_contiguous() and residual.shape == (M, N), (wo.shape, residual.shape)
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and qkv.is_contiguous()
    assert residual.is_contiguous() and cos.is_contiguous() and sin.is_contiguous() and cos.shape[-1] == hd
    block_t = min(triton.next_power_of_2(k_cache.shape[2]), block_t)
    blocks = triton.cdiv(N, block_n)
    pdl = _use_pdl(qkv.device, pdl)
    part, arrivals = kept(("attention-o", qkv.device, M, num_heads, N, blocks), lambda: (
        torch.empty(M * num_heads * N, device=qkv.device, dtype=torch.float32),
        torch.zeros(M * blocks, device=qkv.device, dtype=torch.int32)))
    out = torch.empty(M, N, device=qkv.device, dtype=residual.dtype)
    _attention_o_kernel[(num_heads * blocks, M)](
        qkv, cos, sin, position, k_cache, v_cache, wo, residual, out, part, arrivals,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), hd**-0.5,
        N=N, NH=num_heads, NH_PAD=triton.next_power_of_2(num_heads), KVH=num_kv_heads, HD=hd, BLOCK_T=block_t,
        BLOCK_N=block_n, PDL=pdl, num_warps=num_warps, **({"maxnreg": registers} if registers else {}),
        **_launch_options(pdl),
    )
    return out
