"""Decode attention: RoPE on the new token's q and k, its cache write, and softmax(q K^T) V over
the cache, one program per query head (over ranges of the context, merged after) or one per KV
head and range (`attention_decode_split`, flash-decoding)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.fast.kernels.ahead import _warm_l2, ahead_operands, ahead_plan
from inferlab.fast.kernels.grid import interpreted
from inferlab.fast.kernels.launch import _launch_options, _use_pdl, kept
from inferlab.fast.kernels.policy import ATTENTION_BLOCK_T, MAX_SPLITS, SPLIT_BLOCK_T, SPLIT_COMBINES, SPLIT_POSITIONS


@triton.jit
def _rope(x, x_partner, cos, sin, d, HALF: tl.constexpr):
    """x * cos + rotate_half(x) * sin, where x_partner[d] = x[(d + HALF) % (2 HALF)]."""
    sign = tl.where(d < HALF, -1.0, 1.0)
    return x * cos + sign * x_partner * sin


@triton.jit
def _attend(keys, values, valid, q, scale, best, total, acc):
    """Online softmax: fold the cached positions `keys`/`values` [BLOCK_T, HD] (where `valid`)
    into the running maximum score, normalizer and weighted sum of values."""
    scores = tl.where(valid, tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale, float("-inf"))
    new_best = tl.maximum(best, tl.max(scores, axis=0))
    correction = tl.exp(best - new_best)
    p = tl.exp(scores - new_best)
    total = total * correction + tl.sum(p, axis=0)
    acc = acc * correction + tl.sum(p[:, None] * values.to(tl.float32), axis=0)
    return new_best, total, acc


@triton.jit
def _attend_cached(k_ptr, v_ptr, cache_at, stride_ct, d, q, scale, best, total, acc, t0, t_end, BLOCK_T: tl.constexpr):
    """`_attend` over the cached positions [t0, t_end), BLOCK_T at a time, from the cache at `cache_at`."""
    while t0 < t_end:  # a while loop: its bound is read on the device (a `range` here breaks the interpreter)
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < t_end
        at = cache_at + t[:, None] * stride_ct + d[None, :]
        keys = tl.load(k_ptr + at, mask=valid[:, None], other=0.0)
        values = tl.load(v_ptr + at, mask=valid[:, None], other=0.0)
        best, total, acc = _attend(keys, values, valid, q, scale, best, total, acc)
        t0 += BLOCK_T
    return best, total, acc


@triton.jit
def _early_reads(cos_ptr, sin_ptr, k_ptr, v_ptr, pos, cache_at, stride_ct, d, t_begin, t_end, HD: tl.constexpr,
                 BLOCK_T: tl.constexpr):
    """What a decode attention program may read before its wait (written before the step began):
    the rotary tables at `pos` (float32 [HD]), and the cached keys and values [BLOCK_T, HD] of the
    positions t_begin .. t_begin + BLOCK_T below t_end (zeros past it), with that mask."""
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    t = t_begin + tl.arange(0, BLOCK_T)
    valid = t < t_end
    at = cache_at + t[:, None] * stride_ct + d[None, :]
    keys = tl.load(k_ptr + at, mask=valid[:, None], other=0.0)
    values = tl.load(v_ptr + at, mask=valid[:, None], other=0.0)
    return cos, sin, keys, values, valid


@triton.jit
def _new_token(row, h, kv, cos, sin, d, partner, NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, dtype,
               FROM_L2: tl.constexpr = False):
    """The new token's q of query head h (RoPE'd, rounded to `dtype`, as float32), and k (RoPE'd)
    and v of KV head kv (in `dtype`), from its [q; k; v] row; FROM_L2: read past the SM's L1
    (".cg"), for a row another program of the same launch wrote."""
    HALF: tl.constexpr = HD // 2
    q_at = row + h * HD
    k_at = row + (NH + kv) * HD
    v_at = row + (NH + KVH + kv) * HD
    if FROM_L2:
        q, q_partner = tl.load(q_at + d, cache_modifier=".cg"), tl.load(q_at + partner, cache_modifier=".cg")
        k, k_partner = tl.load(k_at + d, cache_modifier=".cg"), tl.load(k_at + partner, cache_modifier=".cg")
        v = tl.load(v_at + d, cache_modifier=".cg")
    else:
        q, q_partner = tl.load(q_at + d), tl.load(q_at + partner)
        k, k_partner = tl.load(k_at + d), tl.load(k_at + partner)
        v = tl.load(v_at + d)
    q = _rope(q.to(tl.float32), q_partner.to(tl.float32), cos, sin, d, HALF)
    k = _rope(k.to(tl.float32), k_partner.to(tl.float32), cos, sin, d, HALF).to(dtype)
    return q.to(dtype).to(tl.float32), k, v.to(dtype)


@triton.jit
def _attention_decode_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, out_ptr,
    part_acc_ptr, part_best_ptr, part_total_ptr, arrivals_ptr,
    stride_cm, stride_ch, stride_ct, scale, ahead_ptr,
    NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, BLOCK_T: tl.constexpr,
    RANGE: tl.constexpr, RANGES: tl.constexpr, G_PAD: tl.constexpr, PDL: tl.constexpr, LAST: tl.constexpr,
    AHEAD_SLOTS: tl.constexpr = 0, AHEAD_PARTS: tl.constexpr = 1, AHEAD_BYTES: tl.constexpr = 0,
    AHEAD_STRIDE: tl.constexpr = 0, AHEAD_CHUNK: tl.constexpr = 16, AHEAD_THREADS: tl.constexpr = 1,
    INTERPRETED: tl.constexpr = False,
):
    """One (row m, query head h): RoPE on q and k, cache write, softmax(q K^T) V over [0, pos].

    The position, the RoPE tables and the first BLOCK_T cached positions are read before waiting
    on the previous kernel: they were written before the step began (see `attention_decode`).
    With RANGE > 0 each (m, h) has RANGES programs, program r taking the positions
    [r RANGE, (r + 1) RANGE) (range 0 also the new token); ranges past the position are empty.
    Each stores its running maximum, normalizer and weighted sum (an empty range: -inf, 0, 0) in
    the split attention's layout, for `_attention_combine_kernel`; with LAST, the last of the
    head's ranges to finish merges them itself (`_merge_ranges`) and resets the head's arrival
    count to 0, so no second kernel runs.

    AHEAD_SLOTS > 0: before the wait, program pid asks L2 for its share of the o projection's
    weight (`ahead._warm_l2`): the bus is idle while attention runs.
    """
    pid = tl.program_id(0)
    r = pid % RANGES if RANGE else 0
    m = pid // (NH * RANGES)
    h = (pid // RANGES) % NH
    G: tl.constexpr = NH // KVH
    kv = h // G
    HALF: tl.constexpr = HD // 2
    dtype = k_ptr.dtype.element_ty
    d = tl.arange(0, HD)
    partner = (d + HALF) % HD
    pos = tl.load(pos_ptr)
    t_begin = r * RANGE
    t_end = tl.minimum(t_begin + RANGE, pos) if RANGE else pos
    cache_at = m * stride_cm + kv * stride_ch
    cos, sin, keys, values, valid = _early_reads(cos_ptr, sin_ptr, k_ptr, v_ptr, pos, cache_at, stride_ct, d, t_begin,
                                                 t_end, HD, BLOCK_T)
    _warm_l2(ahead_ptr, pid, AHEAD_SLOTS, AHEAD_PARTS, AHEAD_BYTES, AHEAD_STRIDE, AHEAD_CHUNK, AHEAD_THREADS,
             INTERPRETED)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the q, k, v of this token come from the previous kernel
    q, k, v = _new_token(qkv_ptr + m * (NH + 2 * KVH) * HD, h, kv, cos, sin, d, partner, NH, KVH, HD, dtype)
    writer = h % G == 0  # one writer per KV head; readers take the new token from registers
    if RANGE:
        writer = writer & (r == 0)
    if writer:
        tl.store(k_ptr + cache_at + pos * stride_ct + d, k)
        tl.store(v_ptr + cache_at + pos * stride_ct + d, v)
    # Online softmax, starting from the new token's own score (ranges after the first: from nothing).
    best = tl.sum(q * k.to(tl.float32), axis=0) * scale
    total = best * 0.0 + 1.0
    acc = v.to(tl.float32)
    if RANGE:
        first = r == 0
        best = tl.where(first, best, float("-inf"))
        total = tl.where(first, total, 0.0)
        acc = tl.where(first, acc, 0.0)
        if t_begin < t_end:  # an empty range stays (-inf, 0, 0): nothing to rescale
            best, total, acc = _attend(keys, values, valid, q, scale, best, total, acc)
    else:
        best, total, acc = _attend(keys, values, valid, q, scale, best, total, acc)
    best, total, acc = _attend_cached(k_ptr, v_ptr, cache_at, stride_ct, d, q, scale, best, total, acc,
                                      t_begin + BLOCK_T, t_end, BLOCK_T)
    if RANGE:
        part = ((m * KVH + kv) * RANGES + r) * G_PAD + h % G
        tl.store(part_best_ptr + part, best)
        tl.store(part_total_ptr + part, total)
        tl.store(part_acc_ptr + part * HD + d, acc)
        if LAST:
            tl.debug_barrier()  # every thread's partial results are written before the count says so
            if tl.atomic_add(arrivals_ptr + m * NH + h, 1, sem="acq_rel") == RANGES - 1:
                tl.debug_barrier()
                ranges = ((m * KVH + kv) * RANGES + tl.arange(0, RANGES)) * G_PAD + h % G  # [RANGES]
                out = _merge_ranges(tl.load(part_best_ptr + ranges, cache_modifier=".cg"),
                                    tl.load(part_total_ptr + ranges, cache_modifier=".cg"),
                                    tl.load(part_acc_ptr + ranges[:, None] * HD + d[None, :], cache_modifier=".cg"))
                tl.store(out_ptr + m * NH * HD + h * HD + d, out.to(dtype))
                tl.atomic_xchg(arrivals_ptr + m * NH + h, 0)
    else:
        tl.store(out_ptr + m * NH * HD + h * HD + d, (acc / total).to(dtype))


@triton.jit
def _merge_ranges(best, total, parts):
    """One head's output from its ranges' maxima and normalizers [R] and weighted sums [R, HD],
    each range weighted by exp(its maximum - the largest): an empty range (-inf, 0, 0) weighs 0."""
    weight = tl.exp(best - tl.max(best, axis=0))
    return tl.sum(weight[:, None] * parts, axis=0) / tl.sum(weight * total, axis=0)


def _attention_output(qkv, cos, sin, k_cache, v_cache, num_heads: int) -> torch.Tensor:
    """The layouts both attention kernels index by strides, checked; their output [M, nh hd]."""
    hd = k_cache.shape[-1]
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and qkv.is_contiguous()
    assert cos.is_contiguous() and sin.is_contiguous() and cos.shape[-1] == hd
    return torch.empty(qkv.shape[0], num_heads * hd, device=qkv.device, dtype=k_cache.dtype)


def attention_decode(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    block_t: int = ATTENTION_BLOCK_T,
    pdl: bool | None = None,
    range_positions: int = 0,
    combine: str = "kernel",
    ahead: torch.Tensor | None = None,
    ahead_limit: int = 0,
    num_warps: int = 4,
) -> torch.Tensor:
    """Same contract as `inferlab.fast.spec.attention_decode`; reads `position` on the device.

    With programmatic dependent launch the kernel reads `position` and the cache rows before it
    ahead of the previous kernel's end: no kernel still running may write them. A decode step
    satisfies this when it starts after a full dependency (a CUDA graph replay, or a kernel
    launched without PDL such as `greedy_step`), since within a step only the new row is written.

    `range_positions` > 0 (a multiple of `block_t`) cuts each head's context into ranges of that
    many positions, one program each (as many ranges as the cache holds, rounded up to a power of
    two, those past the position empty), merged by `_attention_combine_kernel` (`combine`
    "kernel") or by the last of each head's ranges to finish ("last"): a long context is read by
    many programs at once, a short one by range 0 alone.

    `ahead`, the o projection's weight: its first `ahead_limit` bytes are asked of L2 before the
    wait (`inferlab.fast.kernels.ahead`). A hint: the result is the same. `num_warps`: warps a
    program of the attention kernel.
    """
    assert combine in SPLIT_COMBINES, combine
    out = _attention_output(qkv, cos, sin, k_cache, v_cache, num_heads)
    M, hd = qkv.shape[0], k_cache.shape[-1]
    pdl = _use_pdl(qkv.device, pdl)
    group = num_heads // num_kv_heads
    g_pad = triton.next_power_of_2(group)
    ranges = 1
    if range_positions:
        assert range_positions % block_t == 0, (range_positions, block_t)  # whole tiles per range
        ranges = triton.next_power_of_2(-(-k_cache.shape[2] // range_positions))
        part_acc, part_best, part_total, _ = _split_scratch(qkv.device, M * num_kv_heads, ranges, g_pad, hd)
    else:
        part_acc = part_best = part_total = out  # not read or written without ranges
    last = bool(range_positions) and combine == "last"
    arrivals, = kept(("head-arrivals", qkv.device, M * num_heads), lambda: (
        torch.zeros(M * num_heads, device=qkv.device, dtype=torch.int32),)) if last else (out,)
    programs, warps = M * num_heads * ranges, num_warps
    plan = ahead_plan(ahead, ahead_limit, programs, 32 * warps)
    ahead_ptr, ahead_flags = ahead_operands(ahead, plan, out)
    _attention_decode_kernel[(programs,)](
        qkv, cos, sin, position, k_cache, v_cache, out, part_acc, part_best, part_total, arrivals,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), hd**-0.5, ahead_ptr,
        NH=num_heads, KVH=num_kv_heads, HD=hd, BLOCK_T=block_t, RANGE=range_positions, RANGES=ranges, G_PAD=g_pad,
        PDL=pdl, LAST=last, **ahead_flags, INTERPRETED=interpreted(), num_warps=warps, **_launch_options(pdl),
    )
    if range_positions and not last:
        _attention_combine_kernel[(M * num_heads,)](
            part_acc, part_best, part_total, out,
            NH=num_heads, KVH=num_kv_heads, HD=hd, G=group, G_PAD=g_pad, SPLITS=ranges, PDL=pdl,
            num_warps=2, **_launch_options(pdl),
        )
    return out


@triton.jit
def _attend_group(keys, values, valid, q, scale, best, total, acc):
    """`_attend` for the G query heads of one KV head at once: q [G, HD]; best, total [G]; acc [G, HD]."""
    scores = tl.sum(q[:, None, :] * keys.to(tl.float32)[None, :, :], axis=2) * scale  # [G, BLOCK_T]
    scores = tl.where(valid[None, :], scores, float("-inf"))
    new_best = tl.maximum(best, tl.max(scores, axis=1))
    correction = tl.exp(best - new_best)
    p = tl.exp(scores - new_best[:, None])
    total = total * correction + tl.sum(p, axis=1)
    acc = acc * correction[:, None] + tl.sum(p[:, :, None] * values.to(tl.float32)[None, :, :], axis=1)
    return new_best, total, acc


@triton.jit
def _attention_split_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, out_ptr,
    part_acc_ptr, part_best_ptr, part_total_ptr, arrivals_ptr,
    stride_cm, stride_ch, stride_ct, scale,
    NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_T: tl.constexpr, CHUNK: tl.constexpr, COMBINE: tl.constexpr, PDL: tl.constexpr,
):
    """Split over the context (flash-decoding), one program per (row m, KV head, split).

    The G query heads that share a KV head are one program, so each cached key and value is read
    once, not G times. The positions [0, pos) are cut into SPLITS ranges of whole BLOCK_T tiles;
    each program folds its range into a running maximum, normalizer and weighted sum per query
    head (split 0 starts from the new token, which it also writes to the cache), stores them, and
    counts itself in `arrivals`. The program that arrives last combines the SPLITS partial
    results and resets the count to 0 for the next launch: no second kernel. It loads them as
    whole tiles (every range's maximum and normalizer at once, the weighted sums CHUNK ranges at
    a time), so the combine waits on a few memory round trips, not two per range. Without
    COMBINE the programs only store their partial results, for `_attention_combine_kernel`.
    """
    pid = tl.program_id(0)
    split = pid % SPLITS
    kv = (pid // SPLITS) % KVH
    m = pid // (SPLITS * KVH)
    HALF: tl.constexpr = HD // 2
    dtype = k_ptr.dtype.element_ty
    d = tl.arange(0, HD)
    g = tl.arange(0, G_PAD)
    heads = kv * G + g
    head_ok = g < G
    partner = (d + HALF) % HD
    pos = tl.load(pos_ptr)
    tiles_per_split = tl.cdiv(tl.cdiv(pos, BLOCK_T), SPLITS)
    t0 = split * tiles_per_split * BLOCK_T
    t_end = tl.minimum((split + 1) * tiles_per_split * BLOCK_T, pos)
    cache_at = m * stride_cm + kv * stride_ch
    t = t0 + tl.arange(0, BLOCK_T)
    valid = t < t_end
    at = cache_at + t[:, None] * stride_ct + d[None, :]
    keys = tl.load(k_ptr + at, mask=valid[:, None], other=0.0)  # written in earlier steps: read before the wait
    values = tl.load(v_ptr + at, mask=valid[:, None], other=0.0)
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # this token's q, k, v come from the previous kernel
    row = qkv_ptr + m * (NH + 2 * KVH) * HD
    q_at = row + heads[:, None] * HD
    sign = tl.where(d < HALF, -1.0, 1.0)
    q = tl.load(q_at + d[None, :], mask=head_ok[:, None], other=0.0).to(tl.float32)
    q_partner = tl.load(q_at + partner[None, :], mask=head_ok[:, None], other=0.0).to(tl.float32)
    q = (q * cos[None, :] + sign[None, :] * q_partner * sin[None, :]).to(dtype).to(tl.float32)  # [G_PAD, HD]
    best = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    total = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, HD], dtype=tl.float32)
    if split == 0:  # the new token: written to the cache here, attended from registers
        k_at = row + (NH + kv) * HD
        k = _rope(tl.load(k_at + d).to(tl.float32), tl.load(k_at + partner).to(tl.float32), cos, sin, d, HALF).to(dtype)
        v = tl.load(row + (NH + KVH + kv) * HD + d).to(dtype)
        tl.store(k_ptr + cache_at + pos * stride_ct + d, k)
        tl.store(v_ptr + cache_at + pos * stride_ct + d, v)
        best = tl.sum(q * k.to(tl.float32)[None, :], axis=1) * scale
        total = best * 0.0 + 1.0
        acc = acc + v.to(tl.float32)[None, :]
    while t0 < t_end:  # a while loop: its bounds are read on the device
        best, total, acc = _attend_group(keys, values, valid, q, scale, best, total, acc)
        t0 += BLOCK_T
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < t_end
        at = cache_at + t[:, None] * stride_ct + d[None, :]
        keys = tl.load(k_ptr + at, mask=valid[:, None], other=0.0)
        values = tl.load(v_ptr + at, mask=valid[:, None], other=0.0)
    group = m * KVH + kv
    part = (group * SPLITS + split) * G_PAD + g
    tl.store(part_best_ptr + part, best)
    tl.store(part_total_ptr + part, total)
    tl.store(part_acc_ptr + part[:, None] * HD + d[None, :], acc)
    if not COMBINE:
        return
    tl.debug_barrier()  # every thread's partial results are written before the count says so
    arrived = tl.atomic_add(arrivals_ptr + group, 1, sem="acq_rel")
    if arrived == SPLITS - 1:  # the last of this group's programs: combine
        tl.debug_barrier()
        ranges = tl.arange(0, SPLITS)
        at_all = (group * SPLITS + ranges[:, None]) * G_PAD + g[None, :]  # [SPLITS, G_PAD]
        top = tl.max(tl.load(part_best_ptr + at_all, cache_modifier=".cg"), axis=0)  # [G_PAD]
        out = tl.zeros([G_PAD, HD], dtype=tl.float32)
        norm = tl.zeros([G_PAD], dtype=tl.float32)
        for c in tl.static_range(0, SPLITS, CHUNK):
            at_c = (group * SPLITS + c + tl.arange(0, CHUNK)[:, None]) * G_PAD + g[None, :]  # [CHUNK, G_PAD]
            weight = tl.exp(tl.load(part_best_ptr + at_c, cache_modifier=".cg") - top[None, :])  # 0 for an empty range
            norm += tl.sum(weight * tl.load(part_total_ptr + at_c, cache_modifier=".cg"), axis=0)
            parts = tl.load(part_acc_ptr + at_c[:, :, None] * HD + d[None, None, :], cache_modifier=".cg")
            out += tl.sum(weight[:, :, None] * parts, axis=0)
        out_at = out_ptr + m * NH * HD + heads[:, None] * HD + d[None, :]
        tl.store(out_at, (out / norm[:, None]).to(dtype), mask=head_ok[:, None])
        tl.atomic_xchg(arrivals_ptr + group, 0)


@triton.jit
def _attention_combine_kernel(
    part_acc_ptr, part_best_ptr, part_total_ptr, out_ptr,
    NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr,
    SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    """One program per (row m, query head h): the SPLITS partial results of `_attention_split_kernel`
    (run without COMBINE) or of `_attention_decode_kernel` over ranges, loaded at once and merged,
    softmax-weighted by each range's maximum.

    Every program waits on one memory round trip, whatever SPLITS is; an empty range has
    maximum -inf and weighs 0 (range 0 always holds the new token, so the maximum is finite).
    """
    pid = tl.program_id(0)
    m = pid // NH
    h = pid % NH
    group = m * KVH + h // G
    r = tl.arange(0, SPLITS)
    d = tl.arange(0, HD)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the partial results come from the previous kernel
    at = (group * SPLITS + r) * G_PAD + h % G  # [SPLITS]
    out = _merge_ranges(tl.load(part_best_ptr + at), tl.load(part_total_ptr + at),
                        tl.load(part_acc_ptr + at[:, None] * HD + d[None, :]))  # [SPLITS, HD]
    tl.store(out_ptr + m * NH * HD + h * HD + d, out.to(out_ptr.dtype.element_ty))


def _split_scratch(device: torch.device, groups: int, splits: int, g_pad: int, hd: int) -> tuple:
    """Partial results (weighted sums, maxima, normalizers) and arrival counts for `groups` (row,
    KV head) pairs of the split attention."""
    return kept(("attention", device, groups, splits, g_pad, hd), lambda: (
        torch.empty(groups * splits * g_pad * hd, device=device, dtype=torch.float32),
        torch.empty(groups * splits * g_pad, device=device, dtype=torch.float32),
        torch.empty(groups * splits * g_pad, device=device, dtype=torch.float32),
        torch.zeros(groups, device=device, dtype=torch.int32)))


def combine_chunk(splits: int, g_pad: int, hd: int, elements: int = 4096) -> int:
    """Ranges the split attention's combine loads at once: a power of two with CHUNK x g_pad x hd
    at most `elements` floats (32 registers a thread over 4 warps), and at most `splits`."""
    chunk = max(1, elements // (g_pad * hd))
    return min(splits, 1 << (chunk.bit_length() - 1))


def attention_splits(cache_length: int, split_positions: int = SPLIT_POSITIONS, max_splits: int = MAX_SPLITS) -> int:
    """How many ranges `attention_decode_split` cuts the context into: about one per
    `split_positions` positions of the cache, a power of two, at most `max_splits`. Fixed by the
    cache's length, so a captured graph keeps its grid while the position grows."""
    wanted = max(1, -(-cache_length // split_positions))
    return min(max_splits, 1 << (wanted - 1).bit_length())


def attention_decode_split(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    block_t: int = SPLIT_BLOCK_T,
    splits: int | None = None,
    pdl: bool | None = None,
    chunk: int | None = None,
    combine: str = "last",
) -> torch.Tensor:
    """Same contract as `inferlab.fast.spec.attention_decode`, split over the context (see
    `_attention_split_kernel`); `splits` defaults to `attention_splits(cache length)`, `chunk`
    (ranges combined at once, a power of two dividing `splits`) to `combine_chunk`. `combine`
    "last": the ranges are combined in the kernel; "kernel": by `_attention_combine_kernel`."""
    assert combine in SPLIT_COMBINES, combine
    out = _attention_output(qkv, cos, sin, k_cache, v_cache, num_heads)
    M, hd = qkv.shape[0], k_cache.shape[-1]
    group = num_heads // num_kv_heads
    g_pad = triton.next_power_of_2(group)
    splits = splits or attention_splits(k_cache.shape[2])
    chunk = min(chunk, splits) if chunk else combine_chunk(splits, g_pad, hd)
    assert splits % chunk == 0, (splits, chunk)  # the combine's last chunk must end at the group's last range
    part_acc, part_best, part_total, arrivals = _split_scratch(qkv.device, M * num_kv_heads, splits, g_pad, hd)
    pdl = _use_pdl(qkv.device, pdl)
    _attention_split_kernel[(M * num_kv_heads * splits,)](
        qkv, cos, sin, position, k_cache, v_cache, out, part_acc, part_best, part_total, arrivals,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), hd**-0.5,
        NH=num_heads, KVH=num_kv_heads, HD=hd, G=group, G_PAD=g_pad, SPLITS=splits, BLOCK_T=block_t,
        CHUNK=chunk, COMBINE=combine == "last", PDL=pdl,
        num_warps=4, **_launch_options(pdl),
    )
    if combine == "kernel":
        _attention_combine_kernel[(M * num_heads,)](
            part_acc, part_best, part_total, out,
            NH=num_heads, KVH=num_kv_heads, HD=hd, G=group, G_PAD=g_pad, SPLITS=splits, PDL=pdl,
            num_warps=2, **_launch_options(pdl),
        )
    return out
