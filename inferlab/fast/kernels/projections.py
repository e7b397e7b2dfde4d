"""The projections: one kernel per matrix that reads it once, with the RMSNorm before it and the
SiLU x up or the residual add after it fused in.

- `_gemv_kernel`: one row (or a few, one program each), BLOCK_N weight rows a program;
- `_gemv_rows_kernel`: from `LaunchPolicy.rows_min_batch` rows, small matrix products on the
  tensor cores that read each weight tile once for the whole batch (split over K on request);
- `_gemv_batch_kernel`: 2-8 rows on the CUDA cores (`LaunchPolicy(batched="cuda")`), or 2-8
  rows one row at a time in the one-row kernel's long tiles (`LaunchPolicy(batched="rowwise")`);
- `_gemv_stream_kernel`: the tensor-core products with each matrix's work cut evenly between a
  fixed number of programs, whatever its shape (stream-K, `LaunchPolicy(batched="stream")`).

`gemv` picks one by the policy and the number of rows.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from inferlab.fast.kernels.launch import _launch_options, _use_pdl, kept, multiprocessors
from inferlab.fast.kernels.policy import DEFAULT_POLICY, LaunchConfig, LaunchPolicy


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
def _gemv_kernel(
    x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr,
    M, eps,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr,
):
    """out[m, n] for BLOCK_N consecutive n of one row m; the program reads its rows of W once.

    The first tile of W is loaded before waiting on the previous kernel: weights are never
    written, so under programmatic dependent launch the read starts while that kernel finishes.

    EARLY issues every load that does not wait on a reduction at once: the residual right after
    the wait, beside the input; and where K fits one tile, the norm weight before the wait and the
    input once for its norm and its products. Otherwise each is a further round trip to memory
    after a reduction.
    """
    pid = tl.program_id(0)
    m = pid % M  # programs of one weight block and different rows run side by side: L2 shares W
    offs_n = (pid // M) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = offs_n.to(tl.int64)[:, None] * K
    up_rows = (offs_n + N).to(tl.int64)[:, None] * K
    x_row = x_ptr + m * K
    dtype = w_ptr.dtype.element_ty
    offs_k = tl.arange(0, BLOCK_K)
    w = _weight_tile(w_ptr, rows, offs_k, mask_n, K, EVEN_N and EVEN_K)
    if GATED:
        u = _weight_tile(w_ptr, up_rows, offs_k, mask_n, K, EVEN_N and EVEN_K)
    ONE_READ: tl.constexpr = EARLY and K <= BLOCK_K
    if ONE_READ and NORM:
        g = _load_row(norm_ptr, offs_k, K, EVEN_K)  # a weight too: read before the wait
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # from here on, the previous kernel's writes are visible
    if EARLY and RESIDUAL:
        r = tl.load(res_ptr + m * N + offs_n, mask=mask_n, other=0.0)
    scale = 1.0
    if ONE_READ:
        xv = _load_row(x_row, offs_k, K, EVEN_K)
        if NORM:
            v = xv.to(tl.float32)
            xf = _normed(xv, g, 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / K + eps), dtype)
        else:
            xf = xv.to(tl.float32)[None, :]
    else:
        if NORM:
            scale = _rms_scale(x_row, eps, K, BLOCK_K)
        xf = _input_tile(x_row, norm_ptr, offs_k, scale, K, NORM, EVEN_K, dtype)
    acc = w.to(tl.float32) * xf
    if GATED:
        acc_up = u.to(tl.float32) * xf
    for k0 in range(BLOCK_K, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xf = _input_tile(x_row, norm_ptr, offs_k, scale, K, NORM, EVEN_K, dtype)
        acc += _weight_tile(w_ptr, rows, offs_k, mask_n, K, EVEN_N and EVEN_K).to(tl.float32) * xf
        if GATED:
            acc_up += _weight_tile(w_ptr, up_rows, offs_k, mask_n, K, EVEN_N and EVEN_K).to(tl.float32) * xf
    y = tl.sum(acc, axis=1).to(dtype)
    if GATED:
        y = _silu_times(y, tl.sum(acc_up, axis=1).to(dtype), dtype)
    if RESIDUAL:
        if not EARLY:
            r = tl.load(res_ptr + m * N + offs_n, mask=mask_n, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + m * N + offs_n, y.to(out_ptr.dtype.element_ty), mask=mask_n)


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
                     RMS_K: tl.constexpr):
    """`_rms_scales` of rows row0 .. row0 + BLOCK_M (those below M) as [BLOCK_M], reading the
    RMS_M rows that can exist (RMS_M <= BLOCK_M) RMS_K columns at a time and summing each tile as
    it goes: few, wide loads, so the pass costs few round trips to memory (rows past RMS_M: 0)."""
    offs_r = row0 + tl.arange(0, RMS_M)
    rows = x_ptr + offs_r.to(tl.int64)[:, None] * K
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


@triton.jit
def _gemv_rows_kernel(
    x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, part_ptr, arrivals_ptr,
    M, eps,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    SPLIT_K: tl.constexpr, PDL: tl.constexpr, FP32: tl.constexpr, PREFETCH: tl.constexpr,
    RMS_M: tl.constexpr, RMS_K: tl.constexpr,
):
    """out[m, n] for BLOCK_M rows m and BLOCK_N consecutive n, as a matrix product on the tensor
    cores: each tile of W is read once for all the rows, so a batch costs one read of the weights.

    PREFETCH loads the program's first tile of W before waiting on the previous kernel, as
    `_gemv_kernel` does (weights are never written), and multiplies it once the rows are in.
    RMS_K > 0 reads the rows' RMS pass in wide tiles (`_rms_scales_wide`) instead of BLOCK_K ones.

    SPLIT_K > 1 cuts K into that many ranges, one program each (more programs for a narrow
    matrix): each stores its float32 partial sums and counts itself in `arrivals`; the last to
    arrive adds the partial sums in range order (the same result whatever the arrival order),
    applies the epilogue and resets the count to 0 for the next launch.
    """
    tile_n = tl.program_id(0)
    split = tl.program_id(1)
    tile_m = tl.program_id(2)
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n, mask_m = offs_n < N, offs_m < M
    rows = offs_n.to(tl.int64)[:, None] * K
    up_rows = (offs_n + N).to(tl.int64)[:, None] * K
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K
    dtype = w_ptr.dtype.element_ty
    K_TILES: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    TILES_PER_SPLIT: tl.constexpr = (K_TILES + SPLIT_K - 1) // SPLIT_K
    EVEN: tl.constexpr = EVEN_N and EVEN_K and K_TILES % SPLIT_K == 0
    k_first = split * TILES_PER_SPLIT * BLOCK_K
    if PREFETCH:
        first_k = k_first + tl.arange(0, BLOCK_K)
        w_first = _weight_tile(w_ptr, rows, first_k, mask_n, K, EVEN)  # [BN, BK]
        if GATED:
            u_first = _weight_tile(w_ptr, up_rows, first_k, mask_n, K, EVEN)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    scale = tl.full([BLOCK_M], 1.0, tl.float32)
    if NORM:
        if RMS_K:
            scale = _rms_scales_wide(x_ptr, tile_m * BLOCK_M, M, eps, K, BLOCK_M, RMS_M, RMS_K)
        else:
            scale = _rms_scales(x_rows, mask_m, eps, K, BLOCK_M, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if PREFETCH:
        xv = _input_rows(x_rows, mask_m, norm_ptr, first_k, scale, K, NORM, dtype).to(dtype)
        acc = _tile_dot(xv, w_first, acc, FP32)
        if GATED:
            acc_up = _tile_dot(xv, u_first, acc_up, FP32)
    for k0 in range(BLOCK_K if PREFETCH else 0, TILES_PER_SPLIT * BLOCK_K, BLOCK_K):
        offs_k = k_first + k0 + tl.arange(0, BLOCK_K)
        xv = _input_rows(x_rows, mask_m, norm_ptr, offs_k, scale, K, NORM, dtype).to(dtype)  # [BM, BK]
        acc = _tile_dot(xv, _weight_tile(w_ptr, rows, offs_k, mask_n, K, EVEN), acc, FP32)  # W tile [BN, BK]
        if GATED:
            acc_up = _tile_dot(xv, _weight_tile(w_ptr, up_rows, offs_k, mask_n, K, EVEN), acc_up, FP32)
    at = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    last = True
    if SPLIT_K > 1:
        tile = tile_m * tl.num_programs(0) + tile_n
        cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        PART: tl.constexpr = BLOCK_M * BLOCK_N
        tl.store(part_ptr + ((tile * SPLIT_K + split) * 2) * PART + cell, acc)
        if GATED:
            tl.store(part_ptr + ((tile * SPLIT_K + split) * 2 + 1) * PART + cell, acc_up)
        tl.debug_barrier()  # every thread's partial sums are written before the count says so
        last = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1
        if last:
            tl.debug_barrier()
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(part_ptr + ((tile * SPLIT_K + s) * 2) * PART + cell, cache_modifier=".cg")
                if GATED:
                    acc_up += tl.load(part_ptr + ((tile * SPLIT_K + s) * 2 + 1) * PART + cell, cache_modifier=".cg")
            tl.atomic_xchg(arrivals_ptr + tile, 0)
    if last:
        y = acc.to(dtype)
        if GATED:
            y = _silu_times(y, acc_up.to(dtype), dtype)
        if RESIDUAL:
            r = tl.load(res_ptr + at, mask=mask, other=0.0)
            y = (r.to(tl.float32) + y.to(tl.float32)).to(dtype)
        tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=mask)


def _split_k_scratch(device: torch.device, tiles: int, split_k: int, block_m: int, block_n: int) -> tuple:
    """Partial sums ([gate and up] for each tile and range) and arrival counts for the split-K kernel."""
    return kept(("split-k", device, tiles, split_k, block_m, block_n), lambda: (
        torch.empty(tiles * split_k * 2 * block_m * block_n, device=device, dtype=torch.float32),
        torch.zeros(tiles, device=device, dtype=torch.int32)))


def rows_split_k(n_tiles: int, k_tiles: int, target_programs: int) -> int:
    """Ranges of K for the tensor-core kernel: enough that `n_tiles` output tiles make about
    `target_programs` programs (a power of two, at most one range per K tile); 1 when
    `target_programs` is 0 or the tiles alone reach it."""
    if target_programs <= n_tiles:
        return 1
    wanted = -(-target_programs // n_tiles)
    return min(1 << (wanted - 1).bit_length(), 1 << (k_tiles.bit_length() - 1))


@triton.jit
def _rowwise_tile(x_ptr, M, norm_ptr, offs_k, scale, w, u, acc, acc_up, K: tl.constexpr, NORM: tl.constexpr,
                  GATED: tl.constexpr, EVEN_K: tl.constexpr, ROWS: tl.constexpr, dtype):
    """acc [ROWS, BN] + the weight tile w [BN, BK] (and u, when GATED) times each row's input tile,
    summed over the tile: one row at a time, so only one row's products are ever held. Rows past
    M read row M - 1 (their sums are never stored); `scale` [ROWS] holds the rows' RMS scales."""
    offs_m = tl.arange(0, ROWS)
    wf = w.to(tl.float32)
    uf = wf
    if GATED:
        uf = u.to(tl.float32)
    for r in tl.static_range(ROWS):
        row_scale = tl.sum(tl.where(offs_m == r, scale, 0.0), axis=0)
        xf = _input_tile(x_ptr + tl.minimum(r, M - 1).to(tl.int64) * K, norm_ptr, offs_k, row_scale, K, NORM, EVEN_K,
                         dtype)  # [1, BK]
        here = offs_m[:, None] == r
        acc = tl.where(here, acc + tl.sum(wf * xf, axis=1)[None, :], acc)
        if GATED:
            acc_up = tl.where(here, acc_up + tl.sum(uf * xf, axis=1)[None, :], acc_up)
    return acc, acc_up


@triton.jit
def _gemv_batch_kernel(
    x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr,
    M, eps,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RMS_K: tl.constexpr, ROWWISE: tl.constexpr = False,
):
    """out[m, n] for every row m < M (M <= ROWS) and BLOCK_N consecutive n, on the CUDA cores.

    `_gemv_kernel` for a few rows at once: the program reads each tile of its weight rows once
    and multiplies it into all the rows, accumulating [ROWS, BLOCK_N, BLOCK_K] products
    elementwise and summing over K at the end, as `_gemv_kernel` does for one row. A batch then
    reads the weights once, with no tensor-core tile of 16 rows to fill. The first weight tile
    is read before waiting on the previous kernel; EARLY loads the residual right after the wait.
    RMS_K > 0 reads the rows' RMS pass in wide tiles (`_rms_scales_wide`) instead of BLOCK_K ones.

    ROWWISE multiplies each weight tile into one row at a time and sums it over K at once
    (`_rowwise_tile`), keeping [ROWS, BLOCK_N] sums instead of [ROWS, BLOCK_N, BLOCK_K] products:
    registers for one row's products, so the one-row kernel's long tiles fit at any row count.
    """
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, ROWS)
    mask_n, mask_m = offs_n < N, offs_m < M
    rows = offs_n.to(tl.int64)[:, None] * K
    up_rows = (offs_n + N).to(tl.int64)[:, None] * K
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K
    dtype = w_ptr.dtype.element_ty
    offs_k = tl.arange(0, BLOCK_K)
    w = _weight_tile(w_ptr, rows, offs_k, mask_n, K, EVEN_N and EVEN_K)  # [BN, BK]
    u = w
    if GATED:
        u = _weight_tile(w_ptr, up_rows, offs_k, mask_n, K, EVEN_N and EVEN_K)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    if EARLY and RESIDUAL:
        r = tl.load(res_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :],
                    mask=mask_m[:, None] & mask_n[None, :], other=0.0)
    scale = tl.full([ROWS], 1.0, tl.float32)
    if NORM:
        if RMS_K:
            scale = _rms_scales_wide(x_ptr, 0, M, eps, K, ROWS, ROWS, RMS_K)
        else:
            scale = _rms_scales(x_rows, mask_m, eps, K, ROWS, BLOCK_K)
    if ROWWISE:
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        acc, acc_up = _rowwise_tile(x_ptr, M, norm_ptr, offs_k, scale, w, u, acc, acc, K, NORM, GATED, EVEN_K, ROWS,
                                    dtype)
        for k0 in range(BLOCK_K, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            w = _weight_tile(w_ptr, rows, offs_k, mask_n, K, EVEN_N and EVEN_K)
            u = w
            if GATED:
                u = _weight_tile(w_ptr, up_rows, offs_k, mask_n, K, EVEN_N and EVEN_K)
            acc, acc_up = _rowwise_tile(x_ptr, M, norm_ptr, offs_k, scale, w, u, acc, acc_up, K, NORM, GATED, EVEN_K,
                                        ROWS, dtype)
        y = acc.to(dtype)  # [ROWS, BN]
        if GATED:
            y = _silu_times(y, acc_up.to(dtype), dtype)
    else:
        xv = _input_rows(x_rows, mask_m, norm_ptr, offs_k, scale, K, NORM, dtype)[:, None, :]  # [ROWS, 1, BK]
        acc = w.to(tl.float32)[None, :, :] * xv
        acc_up = acc
        if GATED:
            acc_up = u.to(tl.float32)[None, :, :] * xv
        for k0 in range(BLOCK_K, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            xv = _input_rows(x_rows, mask_m, norm_ptr, offs_k, scale, K, NORM, dtype)[:, None, :]
            acc += _weight_tile(w_ptr, rows, offs_k, mask_n, K, EVEN_N and EVEN_K).to(tl.float32)[None, :, :] * xv
            if GATED:
                acc_up += _weight_tile(w_ptr, up_rows, offs_k, mask_n, K, EVEN_N and EVEN_K).to(tl.float32)[None, :, :] * xv
        y = tl.sum(acc, axis=2).to(dtype)  # [ROWS, BN]
        if GATED:
            y = _silu_times(y, tl.sum(acc_up, axis=2).to(dtype), dtype)
    at = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if RESIDUAL:
        if not EARLY:
            r = tl.load(res_ptr + at, mask=mask, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swap_dot(w, xv, acc, FP32: tl.constexpr):
    """acc + w [BN, BK] @ xv [BM, BK]^T on the tensor cores: the weight rows are the product's long
    side (swap-AB, so a tile of 64 weight rows fills Hopper's 64-row warpgroup product); float32
    without TF32 as `_tile_dot`."""
    if FP32:
        return tl.dot(w, tl.trans(xv), acc, input_precision="ieee")
    return tl.dot(w, tl.trans(xv), acc)


@triton.jit
def _unit_tile(w_ptr, offs_n, offs_k, mask_n, K: tl.constexpr, EVEN_K: tl.constexpr):
    """W[offs_n, offs_k], zero where mask_n is off (and past K): the mask is constant along K when
    EVEN_K, so the loads stay 16 bytes wide."""
    at = w_ptr + offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
    if EVEN_K:
        return tl.load(at, mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
    return tl.load(at, mask=mask_n[:, None] & (offs_k[None, :] < K), other=0.0, eviction_policy="evict_first")


@triton.jit
def _stream_owner(unit, UNITS: tl.constexpr, PROGRAMS: tl.constexpr):
    """The program whose range of units holds `unit` (program p takes units p * UNITS // PROGRAMS
    up to (p + 1) * UNITS // PROGRAMS)."""
    return ((unit + 1) * PROGRAMS + UNITS - 1) // UNITS - 1


@triton.jit
def _stream_epilogue(acc, acc_up, squares, offs_n, offs_m, mask_n, mask_m, res_ptr, out_ptr, eps,
                     N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                     RESIDUAL: tl.constexpr, dtype):
    """out[m, n] from the sums acc [BLOCK_N, BLOCK_M] (and acc_up when GATED) over the whole of K,
    scaled by each row's RMS scale when NORM (`squares`: each row's sum of x^2)."""
    if NORM:
        scale = 1.0 / tl.sqrt(squares / K + eps)
        acc = acc * scale[None, :]
        acc_up = acc_up * scale[None, :]
    y = acc.to(dtype)
    if GATED:
        y = _silu_times(y, acc_up.to(dtype), dtype)
    at = offs_m.to(tl.int64)[None, :] * N + offs_n[:, None]
    mask = mask_n[:, None] & mask_m[None, :]
    if RESIDUAL:
        r = tl.load(res_ptr + at, mask=mask, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _stream_slot(part_ptr, tile, p, acc, acc_up, squares, UNITS: tl.constexpr, PROGRAMS: tl.constexpr,
                 K_TILES: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 NORM: tl.constexpr, GATED: tl.constexpr, N_TILES: tl.constexpr):
    """Store program p's partial sums of `tile` (an index over row tiles and weight tiles) in its slot."""
    PART: tl.constexpr = 2 * BLOCK_N * BLOCK_M + BLOCK_M
    cell = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    owner = _stream_owner((tile % N_TILES) * K_TILES, UNITS, PROGRAMS)
    slot = part_ptr + (tile * SLOTS + p - owner).to(tl.int64) * PART
    tl.store(slot + cell, acc)
    if GATED:
        tl.store(slot + BLOCK_N * BLOCK_M + cell, acc_up)
    if NORM:
        tl.store(slot + 2 * BLOCK_N * BLOCK_M + tl.arange(0, BLOCK_M), squares)


@triton.jit
def _stream_arrive(part_ptr, arrivals_ptr, tile, offs_m, mask_m, res_ptr, out_ptr, eps,
                   N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr,
                   RESIDUAL: tl.constexpr, UNITS: tl.constexpr, PROGRAMS: tl.constexpr, K_TILES: tl.constexpr,
                   N_TILES: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, dtype):
    """Count this program's slot of `tile` as written; the last of the tile's programs to arrive
    adds every slot in order, applies the epilogue and resets the count to 0."""
    PART: tl.constexpr = 2 * BLOCK_N * BLOCK_M + BLOCK_M
    t = tile % N_TILES
    owner = _stream_owner(t * K_TILES, UNITS, PROGRAMS)
    owners = _stream_owner(t * K_TILES + K_TILES - 1, UNITS, PROGRAMS) - owner + 1
    tl.debug_barrier()  # every thread's partial sums are written before the count says so
    if tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == owners - 1:
        tl.debug_barrier()
        cell = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
        for s in range(SLOTS):  # the tile's `owners` slots, in order
            slot = part_ptr + (tile * SLOTS + s).to(tl.int64) * PART
            used = s < owners
            acc += tl.load(slot + cell, mask=used, other=0.0, cache_modifier=".cg")
            if GATED:
                acc_up += tl.load(slot + BLOCK_N * BLOCK_M + cell, mask=used, other=0.0, cache_modifier=".cg")
            if NORM:
                squares += tl.load(slot + 2 * BLOCK_N * BLOCK_M + tl.arange(0, BLOCK_M), mask=used, other=0.0,
                                   cache_modifier=".cg")
        tl.atomic_xchg(arrivals_ptr + tile, 0)
        offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        _stream_epilogue(acc, acc_up, squares, offs_n, offs_m, offs_n < N, mask_m, res_ptr, out_ptr, eps,
                         N, K, NORM, GATED, RESIDUAL, dtype)


@triton.jit
def _stream_weights(w_ptr, u, live, N: tl.constexpr, K: tl.constexpr, K_TILES: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr):
    """Unit u's weight tile [BLOCK_N, BLOCK_K] (and its up tile when GATED; else the same tile),
    zero when not `live`; with the unit's weight rows, their mask and its columns."""
    t = u // K_TILES
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = (u - t * K_TILES) * BLOCK_K + tl.arange(0, BLOCK_K)
    w = _unit_tile(w_ptr, offs_n, offs_k, mask_n & live, K, EVEN_K)
    up = w
    if GATED:
        up = _unit_tile(w_ptr, offs_n + N, offs_k, mask_n & live, K, EVEN_K)
    return w, up, offs_n, mask_n, offs_k


@triton.jit
def _stream_products(w, up, x_rows, norm_ptr, offs_k, live, mask_m, acc, acc_up, squares, K: tl.constexpr,
                     NORM: tl.constexpr, GATED: tl.constexpr, FP32: tl.constexpr, dtype):
    """acc + w @ x tile^T (and acc_up + up @ x tile^T), x times the norm weight when NORM, with
    the rows' sums of x^2 over the tile added to `squares`."""
    xv = tl.load(x_rows + offs_k[None, :], mask=(mask_m[:, None] & live) & (offs_k[None, :] < K), other=0.0)
    if NORM:
        xf = xv.to(tl.float32)
        squares += tl.sum(xf * xf, axis=1)
        g = tl.load(norm_ptr + offs_k, mask=live & (offs_k < K), other=0.0)
        xv = (g.to(tl.float32)[None, :] * xf).to(dtype)
    acc = _swap_dot(w, xv, acc, FP32)
    if GATED:
        acc_up = _swap_dot(up, xv, acc_up, FP32)
    return acc, acc_up, squares


@triton.jit
def _stream_unit_end(acc, acc_up, squares, u, live, u_first, p, tile_m, offs_n, mask_n, offs_m, mask_m, part_ptr,
                     res_ptr, out_ptr, eps, N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr,
                     GATED: tl.constexpr, RESIDUAL: tl.constexpr, UNITS: tl.constexpr, PROGRAMS: tl.constexpr,
                     K_TILES: tl.constexpr, N_TILES: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, dtype):
    """After unit u: where it ends its tile, the epilogue (the whole tile was this program's) or
    the partial sums into this program's slot (its first tile, begun by another), and the sums
    back to 0."""
    t = u // K_TILES
    if live & (u - t * K_TILES == K_TILES - 1):
        if u_first <= t * K_TILES:
            _stream_epilogue(acc, acc_up, squares, offs_n, offs_m, mask_n, mask_m, res_ptr, out_ptr, eps,
                             N, K, NORM, GATED, RESIDUAL, dtype)
        else:
            _stream_slot(part_ptr, tile_m * N_TILES + t, p, acc, acc_up, squares, UNITS, PROGRAMS, K_TILES,
                         SLOTS, BLOCK_M, BLOCK_N, NORM, GATED, N_TILES)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    return acc, acc_up, squares


@triton.jit
def _gemv_stream_kernel(
    x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, part_ptr, arrivals_ptr,
    M, eps,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    PROGRAMS: tl.constexpr, SLOTS: tl.constexpr, PDL: tl.constexpr, FP32: tl.constexpr, PREFETCH: tl.constexpr,
):
    """out[m, n] for BLOCK_M rows m and every n, on the tensor cores, the matrix's work spread
    evenly over PROGRAMS programs whatever its shape (stream-K).

    The work is N_TILES x K_TILES units, a tile of BLOCK_N weight rows times BLOCK_K columns each,
    in order of weight rows, then columns. Program p takes units p * UNITS // PROGRAMS up to
    (p + 1) * UNITS // PROGRAMS in one pipelined loop: every program reads the same weight bytes
    (within a unit), so with one or two programs per SM no SM waits on a last wave. A unit is
    W tile [BLOCK_N, BLOCK_K] @ x tile^T: the weight rows are the product's long side.

    A program sums each tile it holds whole and applies the epilogue in the loop. Of a tile it
    holds part of (only its first and its last can be such), it stores its float32 partial sums in
    its slot (its index among the tile's programs); after the loop it counts itself in `arrivals`,
    and the last of the tile's programs to arrive adds the slots in order (the same result whatever
    the arrival order), applies the epilogue and resets the count to 0. Nothing waits on another
    program.

    With NORM the RMS scale is applied to the sums, not to x: each unit multiplies by
    x * norm-weight (rounded to the weights' dtype) and sums x^2 over its columns beside, and the
    epilogue scales by 1 / sqrt(mean(x^2) + eps), a factor per row; so no pass over x runs before
    the weights stream. In bf16 that rounds at another point than the specification (x * scale,
    then * norm-weight, each rounded): an error of the same size.

    PREFETCH loads the first unit's weight tile before waiting on the previous kernel, as the
    one-row kernel does, and multiplies it once the input is in.
    """
    p = tl.program_id(0)
    tile_m = tl.program_id(1)
    K_TILES: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    UNITS: tl.constexpr = N_TILES * K_TILES
    u_first = p * UNITS // PROGRAMS
    u_end = (p + 1) * UNITS // PROGRAMS
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K
    dtype = w_ptr.dtype.element_ty
    STEPS: tl.constexpr = (UNITS + PROGRAMS - 1) // PROGRAMS  # units of the longest range
    if PREFETCH:  # the first unit's weights, before the wait (weights are never written)
        w_first, up_first, offs_n, mask_n, offs_k = _stream_weights(w_ptr, u_first, u_first < u_end, N, K, K_TILES,
                                                                    BLOCK_N, BLOCK_K, GATED, EVEN_K)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    squares = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PREFETCH:
        acc, acc_up, squares = _stream_products(w_first, up_first, x_rows, norm_ptr, offs_k, u_first < u_end, mask_m,
                                                acc, acc_up, squares, K, NORM, GATED, FP32, dtype)
        acc, acc_up, squares = _stream_unit_end(acc, acc_up, squares, u_first, u_first < u_end, u_first, p, tile_m,
                                                offs_n, mask_n, offs_m, mask_m, part_ptr, res_ptr, out_ptr, eps, N, K,
                                                NORM, GATED, RESIDUAL, UNITS, PROGRAMS, K_TILES, N_TILES, SLOTS,
                                                BLOCK_M, BLOCK_N, dtype)
    # a bound known to the compiler; a shorter range idles its last step
    for i in range(1 if PREFETCH else 0, STEPS):
        u = u_first + i
        live = u < u_end
        w, up, offs_n, mask_n, offs_k = _stream_weights(w_ptr, u, live, N, K, K_TILES, BLOCK_N, BLOCK_K, GATED, EVEN_K)
        acc, acc_up, squares = _stream_products(w, up, x_rows, norm_ptr, offs_k, live, mask_m, acc, acc_up, squares,
                                                K, NORM, GATED, FP32, dtype)
        acc, acc_up, squares = _stream_unit_end(acc, acc_up, squares, u, live, u_first, p, tile_m, offs_n, mask_n,
                                                offs_m, mask_m, part_ptr, res_ptr, out_ptr, eps, N, K, NORM, GATED,
                                                RESIDUAL, UNITS, PROGRAMS, K_TILES, N_TILES, SLOTS, BLOCK_M, BLOCK_N,
                                                dtype)
    t_first = u_first // K_TILES
    t_last = (u_end - 1) // K_TILES
    ends_inside = (u_end > u_first) & (u_end % K_TILES != 0)  # the last tile goes on in the next program
    if ends_inside:
        _stream_slot(part_ptr, tile_m * N_TILES + t_last, p, acc, acc_up, squares, UNITS, PROGRAMS, K_TILES, SLOTS,
                     BLOCK_M, BLOCK_N, NORM, GATED, N_TILES)
    if (u_end > u_first) & (u_first % K_TILES != 0) & ((t_first < t_last) | (not ends_inside)):
        # the first tile was begun by another program and ended in this one's loop
        _stream_arrive(part_ptr, arrivals_ptr, tile_m * N_TILES + t_first, offs_m, mask_m, res_ptr, out_ptr, eps,
                       N, K, NORM, GATED, RESIDUAL, UNITS, PROGRAMS, K_TILES, N_TILES, SLOTS, BLOCK_M, BLOCK_N,
                       dtype)
    if ends_inside:
        _stream_arrive(part_ptr, arrivals_ptr, tile_m * N_TILES + t_last, offs_m, mask_m, res_ptr, out_ptr, eps,
                       N, K, NORM, GATED, RESIDUAL, UNITS, PROGRAMS, K_TILES, N_TILES, SLOTS, BLOCK_M, BLOCK_N,
                       dtype)


def stream_owner(unit: int, units: int, programs: int) -> int:
    """`_stream_owner` on the host: the program of `programs` whose range of `units` holds `unit`."""
    return ((unit + 1) * programs + units - 1) // units - 1


@functools.cache
def stream_slots(n_tiles: int, k_tiles: int, programs: int) -> int:
    """The most programs that share one weight tile in `_gemv_stream_kernel`: its partial-sum slots a tile."""
    units = n_tiles * k_tiles
    return max(stream_owner(t * k_tiles + k_tiles - 1, units, programs) - stream_owner(t * k_tiles, units, programs) + 1
               for t in range(n_tiles))


def _stream_scratch(device: torch.device, tiles: int, slots: int, block_m: int, block_n: int) -> tuple:
    """Partial-sum slots (acc, acc_up, the rows' sums of x^2) and arrival counts for the stream-K kernel."""
    return kept(("stream-k", device, tiles, slots, block_m, block_n), lambda: (
        torch.empty(tiles * slots * (2 * block_n * block_m + block_m), device=device, dtype=torch.float32),
        torch.zeros(tiles, device=device, dtype=torch.int32)))


def rms_columns(rows: int, k: int, elements: int = 8192) -> int:
    """Columns per tile of `_rms_scales_wide` over `rows` rows (a power of two): `elements` values
    a tile (128 bytes a thread of bf16 over 4 warps), at most K rounded up to a power of two."""
    return min(triton.next_power_of_2(k), max(16, elements // rows))


def batch_config(rows: int, gated: bool, elements: int = 4096) -> LaunchConfig:
    """`_gemv_batch_kernel`'s launch shape for `rows` (a power of two): 4 weight rows a program,
    and K tiles such that the products it keeps, rows x 4 x BLOCK_K (twice when gated), are at
    most `elements` floats (32 registers a thread over 4 warps), at least 32 columns."""
    block_k = max(32, elements // (rows * 4 * (2 if gated else 1)))
    return LaunchConfig(block_n=4, block_k=block_k, num_warps=4, num_stages=3)


# From `policy.rows_min_batch` rows on, the tensor-core kernel (tiles of at least 16 x 16 x 16);
# below it, one `_gemv_kernel` program per row and weight block, sharing each tile between rows
# through L2. The switch point is measured (docs/perf/h200/kernels.md, § Batches).
def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    out_dtype: torch.dtype | None = None,
    config: LaunchConfig | None = None,
    pdl: bool | None = None,
    policy: LaunchPolicy = DEFAULT_POLICY,
) -> torch.Tensor:
    """Same contract as `inferlab.fast.spec.gemv`: x [M, K], weight [N or 2N, K] -> [M, N].

    The kernel and its launch are `policy.rows_launch`'s: below `policy.rows_min_batch` rows
    `_gemv_kernel`, from there `_gemv_rows_kernel`; with `policy.batched == "cuda"`, 2 to
    `policy.cuda_max_rows` rows run `_gemv_batch_kernel`, with "rowwise" 2 to
    `policy.rowwise_max_rows` rows run it one row at a time in the one-row kernel's launch shape
    (`_rowwise_tile`); with "stream", from `policy.rows_min_batch` rows `_gemv_stream_kernel`; a
    matrix measured at that many rows (`policy.rows`) runs the kernel measured fastest. `config`
    overrides the launch shape.
    """
    M, K = x.shape
    N = weight.shape[0] // 2 if gated else weight.shape[0]
    assert weight.shape[1] == K and x.is_contiguous() and weight.is_contiguous(), (x.shape, weight.shape)
    out = torch.empty(M, N, device=x.device, dtype=out_dtype or x.dtype)
    pdl = _use_pdl(x.device, pdl)
    operands = (x, weight, x if norm is None else norm, x if residual is None else residual, out, M, eps)
    flags = dict(N=N, K=K, NORM=norm is not None, GATED=gated, RESIDUAL=residual is not None, PDL=pdl)
    launch = policy.rows_launch(N, K, gated, M)
    if launch.kernel in ("cuda", "rowwise"):
        rows, rowwise = triton.next_power_of_2(M), launch.kernel == "rowwise"
        c = config or launch.config or (policy.gemv_config(N, K, gated) if rowwise else batch_config(rows, gated))
        _gemv_batch_kernel[(triton.cdiv(N, c.block_n),)](
            *operands, **flags, ROWS=rows, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            EVEN_N=N % c.block_n == 0, EVEN_K=K % c.block_k == 0, EARLY=policy.early_loads,
            RMS_K=rms_columns(rows, K) if policy.wide_rms else 0, ROWWISE=rowwise,
            num_warps=c.num_warps, num_stages=c.num_stages, **_launch_options(pdl),
        )
        return out
    if launch.kernel == "stream":
        c = config or launch.config or policy.stream_gemv
        n_tiles, k_tiles = triton.cdiv(N, c.block_n), triton.cdiv(K, c.block_k)
        m_tiles = triton.cdiv(M, policy.rows_block_m)
        programs = min(n_tiles * k_tiles, launch.target_programs or policy.stream_per_sm * multiprocessors(x.device))
        slots = stream_slots(n_tiles, k_tiles, programs)
        part, arrivals = _stream_scratch(x.device, m_tiles * n_tiles, slots, policy.rows_block_m, c.block_n)
        _gemv_stream_kernel[(programs, m_tiles)](
            *operands[:5], part, arrivals, *operands[5:], **flags, BLOCK_M=policy.rows_block_m, BLOCK_N=c.block_n,
            BLOCK_K=c.block_k, EVEN_K=K % c.block_k == 0, PROGRAMS=programs, SLOTS=slots,
            FP32=weight.dtype == torch.float32, PREFETCH=launch.prefetch, num_warps=c.num_warps,
            num_stages=c.num_stages, **_launch_options(pdl),
        )
        return out
    if launch.kernel == "row":
        c = config or launch.config or policy.gemv_config(N, K, gated)
        _gemv_kernel[(M * triton.cdiv(N, c.block_n),)](
            *operands, **flags, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            EVEN_N=N % c.block_n == 0, EVEN_K=K % c.block_k == 0, EARLY=policy.early_loads,
            num_warps=c.num_warps, num_stages=c.num_stages, **_launch_options(pdl),
        )
        return out
    c = config or launch.config or policy.rows_gemv
    n_tiles, m_tiles = triton.cdiv(N, c.block_n), triton.cdiv(M, policy.rows_block_m)
    split_k = rows_split_k(n_tiles * m_tiles, triton.cdiv(K, c.block_k), launch.target_programs)
    part, arrivals = (out, out) if split_k == 1 else _split_k_scratch(x.device, n_tiles * m_tiles, split_k,
                                                                      policy.rows_block_m, c.block_n)
    rms_m = min(policy.rows_block_m, triton.next_power_of_2(M)) if policy.wide_rms else 0  # rows a tile can hold
    _gemv_rows_kernel[(n_tiles, split_k, m_tiles)](
        *operands[:5], part, arrivals, *operands[5:], **flags, BLOCK_M=policy.rows_block_m, BLOCK_N=c.block_n,
        BLOCK_K=c.block_k, EVEN_N=N % c.block_n == 0, EVEN_K=K % c.block_k == 0, SPLIT_K=split_k,
        FP32=weight.dtype == torch.float32, PREFETCH=launch.prefetch, RMS_M=rms_m,
        RMS_K=rms_columns(rms_m, K) if rms_m else 0, num_warps=c.num_warps, num_stages=c.num_stages,
        **_launch_options(pdl),
    )
    return out
