"""Tiles shared by the projection kernels: loads of weight and input tiles, the RMS scales of
the input rows, the input normalized and rounded as the specification rounds it, SiLU x up, the
tensor-core product of a tile, and the partial sums of a tile whose K is split between programs.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rms_scale(x_row, eps, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) over one row of K elements."""
    total = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        total += v * v
    return 1.0 / tl.sqrt(tl.sum(total, axis=0) / K + eps)


@triton.jit
def _weight_tile(w_ptr, rows, offs_k, mask_n, K: tl.constexpr, EVEN: tl.constexpr):
    if EVEN:  # no mask: nothing stands between the compiler and 16-byte loads
        return tl.load(w_ptr + rows + offs_k[None, :], eviction_policy="evict_first")
    mask = mask_n[:, None] & (offs_k[None, :] < K)
    return tl.load(w_ptr + rows + offs_k[None, :], mask=mask, other=0.0, eviction_policy="evict_first")


@triton.jit
def _load_row(x_row, offs_k, K: tl.constexpr, EVEN_K: tl.constexpr):
    """x[offs_k], zero past K."""
    if EVEN_K:
        return tl.load(x_row + offs_k)
    return tl.load(x_row + offs_k, mask=offs_k < K, other=0.0)


@triton.jit
def _input_tile(x_row, norm_ptr, offs_k, scale, K: tl.constexpr, NORM: tl.constexpr, EVEN_K: tl.constexpr, dtype):
    """x[offs_k] as float32 [1, BLOCK_K], RMS-normalized and scaled by the norm weight when NORM."""
    xv = _load_row(x_row, offs_k, K, EVEN_K)
    if NORM:
        return _normed(xv, _load_row(norm_ptr, offs_k, K, EVEN_K), scale, dtype)
    return xv.to(tl.float32)[None, :]


@triton.jit
def _normed(xv, g, scale, dtype):
    """x tile times its RMS scale, then times the norm weight g, rounded to `dtype` after each
    product as the specification rounds them; as float32 [1, BLOCK_K]."""
    xv = (xv.to(tl.float32) * scale).to(dtype)
    xv = (g.to(tl.float32) * xv.to(tl.float32)).to(dtype)
    return xv.to(tl.float32)[None, :]


@triton.jit
def _silu_times(gate, up, dtype):
    """SiLU(gate) x up, rounded to `dtype` after each step as the specification rounds it."""
    g = gate.to(tl.float32)
    y = (g / (1.0 + tl.exp(-g))).to(dtype)
    return (y.to(tl.float32) * up.to(tl.float32)).to(dtype)


@triton.jit
def _rms_scales(x_rows, mask_m, eps, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) for each of BLOCK_M rows of K elements."""
    total = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(x_rows + offs[None, :], mask=mask_m[:, None] & (offs[None, :] < K), other=0.0).to(tl.float32)
        total += v * v
    return 1.0 / tl.sqrt(tl.sum(total, axis=1) / K + eps)


@triton.jit
def _rms_scales_wide(x_ptr, row0, M, eps, K: tl.constexpr, BLOCK_M: tl.constexpr, RMS_M: tl.constexpr,
                     RMS_K: tl.constexpr, AT_ONCE: tl.constexpr = False):
    """`_rms_scales` of rows row0 .. row0 + BLOCK_M (those below M) as [BLOCK_M], reading the
    RMS_M rows that can exist (RMS_M <= BLOCK_M) RMS_K columns at a time and summing each tile as
    it goes: few, wide loads, so the pass costs few round trips to memory (rows past RMS_M: 0).

    AT_ONCE: the tiles' squares are added element by element and reduced once at the end, in an
    unrolled loop with no reduction (and so no barrier) between two loads: every tile's load is
    issued before the first reduction, one round trip where the loop above takes one a tile (4 at
    16 rows of 2048, seen in the sm_90 machine code). The same sum in another order: equal to a
    float32 rounding, and to the bit with one tile."""
    offs_r = row0 + tl.arange(0, RMS_M)
    rows = x_ptr + offs_r.to(tl.int64)[:, None] * K
    if AT_ONCE:
        squares = tl.zeros([RMS_M, RMS_K], dtype=tl.float32)
        for k0 in tl.static_range(0, K, RMS_K):
            offs = k0 + tl.arange(0, RMS_K)
            v = tl.load(rows + offs[None, :], mask=(offs_r[:, None] < M) & (offs[None, :] < K), other=0.0).to(tl.float32)
            squares += v * v
        total = tl.sum(squares, axis=1)
    else:
        total = tl.zeros([RMS_M], dtype=tl.float32)
        for k0 in range(0, K, RMS_K):
            offs = k0 + tl.arange(0, RMS_K)
            v = tl.load(rows + offs[None, :], mask=(offs_r[:, None] < M) & (offs[None, :] < K), other=0.0).to(tl.float32)
            total += tl.sum(v * v, axis=1)
    scale = 1.0 / tl.sqrt(total / K + eps)
    offs_m = row0 + tl.arange(0, BLOCK_M)
    return tl.sum(tl.where(offs_m[:, None] == offs_r[None, :], scale[None, :], 0.0), axis=1)


@triton.jit
def _input_rows(x_rows, mask_m, norm_ptr, offs_k, scale, K: tl.constexpr, NORM: tl.constexpr, dtype):
    """x[rows, offs_k] as float32 [BLOCK_M, BLOCK_K], rounded like `_input_tile`."""
    mask_k = offs_k < K
    xv = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
    if NORM:
        g = tl.load(norm_ptr + offs_k, mask=mask_k, other=0.0)
        xv = (xv.to(tl.float32) * scale[:, None]).to(dtype)
        xv = (g.to(tl.float32)[None, :] * xv.to(tl.float32)).to(dtype)
    return xv.to(tl.float32)


@triton.jit
def _tile_dot(xv, w, acc, FP32: tl.constexpr):
    """acc + xv [BM, BK] @ w [BN, BK]^T on the tensor cores; in float32 without TF32 (the same
    products as the specification's float32 matmul)."""
    if FP32:
        return tl.dot(xv, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(xv, tl.trans(w), acc)


def rms_columns(rows: int, k: int, elements: int = 8192) -> int:
    """Columns per tile of `_rms_scales_wide` over `rows` rows (a power of two): `elements` values
    a tile (128 bytes a thread of bf16 over 4 warps), at most K rounded up to a power of two."""
    return min(triton.next_power_of_2(k), max(16, elements // rows))


@triton.jit
def _split_k_sums(part_ptr, arrivals_ptr, tile, split, acc, acc_up, R: tl.constexpr, C: tl.constexpr,
                  SPLIT_K: tl.constexpr, GATED: tl.constexpr):
    """K split between SPLIT_K programs of one output tile: store this program's float32 partial
    sums (acc, and acc_up when GATED, each [R, C]) in slot `split` of `tile` and count the program in
    `arrivals`. The last of the tile's programs to arrive adds every slot in split order (the same
    result whatever the arrival order), resets the count to 0 for the next launch and returns
    (True, the sums); the others return (False, their own partial sums)."""
    cell = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    PART: tl.constexpr = R * C
    slot = part_ptr + ((tile * SPLIT_K + split) * 2).to(tl.int64) * PART
    tl.store(slot + cell, acc)
    if GATED:
        tl.store(slot + PART + cell, acc_up)
    tl.debug_barrier()  # every thread's partial sums are written before the count says so
    last = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1
    if last:
        tl.debug_barrier()
        acc = tl.zeros([R, C], dtype=tl.float32)
        acc_up = tl.zeros([R, C], dtype=tl.float32)
        for s in range(SPLIT_K):
            slot = part_ptr + ((tile * SPLIT_K + s) * 2).to(tl.int64) * PART
            acc += tl.load(slot + cell, cache_modifier=".cg")
            if GATED:
                acc_up += tl.load(slot + PART + cell, cache_modifier=".cg")
        tl.atomic_xchg(arrivals_ptr + tile, 0)
    return last, acc, acc_up


@triton.jit
def _wait_then_scales(x_ptr, row0, M, eps, K: tl.constexpr, BLOCK_M: tl.constexpr, RMS_M: tl.constexpr,
                      RMS_K: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr, AT_ONCE: tl.constexpr = False):
    """Wait for the previous kernel (under PDL), then the RMS scales [BLOCK_M] of rows row0 ..
    row0 + BLOCK_M (`_rms_scales_wide`, its loads `AT_ONCE` or not; 1 without NORM): the first
    reads of what it wrote."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    scale = tl.full([BLOCK_M], 1.0, tl.float32)
    if NORM:
        scale = _rms_scales_wide(x_ptr, row0, M, eps, K, BLOCK_M, RMS_M, RMS_K, AT_ONCE)
    return scale
