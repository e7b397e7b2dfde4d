"""A layer's [q; k; v] projection and its decode attention in one launch
(`LaunchPolicy(qkv_attention_cache=...)`).

The attention of one new token over a short cache is little work, but as a kernel of its own it
waits for the whole projection before it to end, and the o projection after it waits for it to
end: two kernel boundaries for a few microseconds of work. Here one grid runs both:

- its first M x (N / BLOCK_N) programs are the one-row projection's (`projections._gemv_block`,
  RMSNorm folded in); each, once its BLOCK_N rows of [q; k; v] are stored, counts itself for the
  (row, KV head) they belong to (BLOCK_N divides the head size, so a program's rows belong to one);
- its last M x nh programs are the attention's, one per (row, query head), as `attention_decode`
  computes it: each loads the position, the rotary tables and its first BLOCK_T cached positions
  at once (written by earlier steps), then waits on its KV head's count, (G + 2) hd / BLOCK_N
  programs (the G query heads' q, its k and v), not on the end of a kernel, and reads those rows
  from L2. The last of a KV head's G attention programs to pass resets the count to 0.

The projection's programs come first in the grid and never wait on the attention's, so the wait
opens whatever order the GPU runs them in, as long as it runs them; a wait that has not opened
after `grid.SPIN_LIMIT` polls counts an error (`grid.barrier_errors`) instead of hanging. Under
Triton's interpreter the programs run one after another in grid order, so every count is complete
when an attention program reaches it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.fast.kernels.attention import _attend, _attend_cached, _attention_output, _early_reads, _new_token
from inferlab.fast.kernels.grid import SPIN_LIMIT, _grid_arrive, _grid_wait, interpreted, wait_errors
from inferlab.fast.kernels.launch import _launch_options, _use_pdl, kept
from inferlab.fast.kernels.policy import LaunchConfig
from inferlab.fast.kernels.projections import _gemv_block


@triton.jit
def _qkv_attention_kernel(
    x_ptr, w_ptr, norm_ptr, qkv_ptr, counts_ptr, errors_ptr,
    cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, out_ptr,
    M, eps, stride_cm, stride_ch, stride_ct, scale,
    K: tl.constexpr, NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_T: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, SPIN: tl.constexpr, INTERPRETED: tl.constexpr,
):
    """Programs below M x N / BLOCK_N: qkv[m, n] for BLOCK_N consecutive n, then counted for
    their (m, KV head). Programs from there: (row m, query head h), attention over [0, pos] as
    `_attention_decode_kernel` without ranges computes it, into out[m, h hd : (h + 1) hd]."""
    N: tl.constexpr = (NH + 2 * KVH) * HD
    G: tl.constexpr = NH // KVH
    pid = tl.program_id(0)
    projection = M * (N // BLOCK_N)
    if pid < projection:
        _gemv_block(pid, projection, x_ptr, w_ptr, norm_ptr, x_ptr, qkv_ptr, M, eps, x_ptr, N, K, True, False, False,
                    BLOCK_N, BLOCK_K, True, EVEN_K, PDL, EARLY, 0, 1, 0, 0, 16, 1, INTERPRETED)
        n0 = (pid // M) * BLOCK_N
        kv = tl.where(n0 < NH * HD, n0 // (G * HD), ((n0 - NH * HD) // HD) % KVH)
        _grid_arrive(counts_ptr + (pid % M) * KVH + kv)
    else:
        a = pid - projection
        m = a // NH
        h = a % NH
        kv = h // G
        d = tl.arange(0, HD)
        partner = (d + HD // 2) % HD
        dtype = k_ptr.dtype.element_ty
        pos = tl.load(pos_ptr)
        cache_at = m * stride_cm + kv * stride_ch
        cos, sin, keys, values, valid = _early_reads(cos_ptr, sin_ptr, k_ptr, v_ptr, pos, cache_at, stride_ct, d, 0,
                                                     pos, HD, BLOCK_T)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        count = counts_ptr + m * KVH + kv
        ready: tl.constexpr = (G + 2) * HD // BLOCK_N
        _grid_wait(count, errors_ptr, ready, SPIN)
        q, k, v = _new_token(qkv_ptr + m * N, h, kv, cos, sin, d, partner, NH, KVH, HD, dtype, True)
        if h % G == 0:  # one writer per KV head; the others take the new token from registers
            tl.store(k_ptr + cache_at + pos * stride_ct + d, k)
            tl.store(v_ptr + cache_at + pos * stride_ct + d, v)
        if tl.atomic_add(count, 1, sem="relaxed", scope="gpu") == ready + G - 1:  # the KV head's last reader
            tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")
        best = tl.sum(q * k.to(tl.float32), axis=0) * scale
        total = best * 0.0 + 1.0
        acc = v.to(tl.float32)
        best, total, acc = _attend(keys, values, valid, q, scale, best, total, acc)
        best, total, acc = _attend_cached(k_ptr, v_ptr, cache_at, stride_ct, d, q, scale, best, total, acc,
                                          pos * 0 + BLOCK_T, pos, BLOCK_T)
        tl.store(out_ptr + m * NH * HD + h * HD + d, (acc / total).to(dtype))


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
    *,
    config: LaunchConfig,
    block_t: int = 32,
    registers: int = 0,
    early: bool = True,
    pdl: bool | None = None,
) -> torch.Tensor:
    """Same contract as `inferlab.fast.spec.qkv_attention`: attention(gemv(x, wqkv, norm=attn_norm))
    [M, nh hd], the cache written as `attention_decode` writes it; one launch.

    `config`: the projection's launch shape (`LaunchPolicy.gemv_config`; its rows a program must
    divide the head size: `LaunchPolicy.qkv_attention_launch`). `block_t`: cached positions an attention program
    loads before its wait and a step of its loop after (at most the cache's length rounded up to
    a power of two). `registers` > 0: at most that many registers a thread (ptxas's maxnreg; it
    spills the rest), so that more programs share an SM. `early`: the projection's `EARLY` loads
    (`LaunchPolicy.early_loads`).
    With programmatic dependent launch, the contract of `attention_decode` on `position` and the
    cache rows holds here too.
    """
    M, K = x.shape
    hd = k_cache.shape[-1]
    assert wqkv.shape[0] == (num_heads + 2 * num_kv_heads) * hd and hd % config.block_n == 0, (wqkv.shape, config)
    assert wqkv.shape[1] == K and x.is_contiguous() and wqkv.is_contiguous(), (x.shape, wqkv.shape)
    out = _attention_output(x, cos, sin, k_cache, v_cache, num_heads)
    qkv = torch.empty(M, wqkv.shape[0], device=x.device, dtype=x.dtype)
    counts, = kept(("qkv-attention", x.device, M * num_kv_heads), lambda: (
        torch.zeros(M * num_kv_heads, device=x.device, dtype=torch.int32),))
    pdl = _use_pdl(x.device, pdl)
    block_t = min(triton.next_power_of_2(k_cache.shape[2]), block_t)
    programs = M * (wqkv.shape[0] // config.block_n) + M * num_heads
    _qkv_attention_kernel[(programs,)](
        x, wqkv, attn_norm, qkv, counts, wait_errors(x.device), cos, sin, position, k_cache, v_cache, out,
        M, eps, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), hd**-0.5,
        K=K, NH=num_heads, KVH=num_kv_heads, HD=hd, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_K=K % config.block_k == 0, BLOCK_T=block_t, PDL=pdl, EARLY=early, SPIN=SPIN_LIMIT,
        INTERPRETED=interpreted(), num_warps=config.num_warps, num_stages=config.num_stages,
        **({"maxnreg": registers} if registers else {}), **_launch_options(pdl),
    )
    return out
