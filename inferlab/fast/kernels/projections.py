"""The projections: one kernel per matrix that reads it once, with the RMSNorm before it and the
SiLU x up or the residual add after it fused in.

- `_gemv_kernel`: one row (or a few, one program each), BLOCK_N weight rows a program;
- `_gemv_rows_kernel`: from `LaunchPolicy.rows_min_batch` rows, small matrix products on the
  tensor cores that read each weight tile once for the whole batch (split over K on request);
- `_gemv_batch_kernel`: 2-8 rows on the CUDA cores (`LaunchPolicy(batched="cuda")`), or 2-8
  rows one row at a time in the one-row kernel's long tiles (`LaunchPolicy(batched="rowwise")`);
- `inferlab.fast.kernels.stream`: the tensor-core products with each matrix's work cut evenly
  between a fixed number of programs, whatever its shape (stream-K, `LaunchPolicy(batched="stream")`);
- `inferlab.fast.kernels.tma`: the tensor-core products with the weight tiles copied by the tensor
  memory accelerator, split over K to fill the GPU (`LaunchPolicy(batched="tma")`).

`gemv` picks one by the policy and the number of rows; the tiles they share are in
`inferlab.fast.kernels.tiles`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.fast.kernels.ahead import _warm_l2, ahead_operands, ahead_plan
from inferlab.fast.kernels.grid import interpreted
from inferlab.fast.kernels.launch import _launch_options, _use_pdl, kept
from inferlab.fast.kernels.policy import DEFAULT_POLICY, LaunchConfig, LaunchPolicy, RowsLaunch
from inferlab.fast.kernels.stream import gemv_stream
from inferlab.fast.kernels.tma import gemv_tma, tma_fits
from inferlab.fast.kernels.tiles import (_input_rows, _input_tile, _load_row, _normed, _rms_scale, _rms_scales,
                                         _rms_scales_wide, _silu_times, _split_k_sums, _tile_dot, _weight_tile,
                                         rms_columns)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr,
    M, eps, ahead_ptr,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr,
    AHEAD_SLOTS: tl.constexpr = 0, AHEAD_PARTS: tl.constexpr = 1, AHEAD_BYTES: tl.constexpr = 0,
    AHEAD_STRIDE: tl.constexpr = 0, AHEAD_CHUNK: tl.constexpr = 16, AHEAD_THREADS: tl.constexpr = 1,
    INTERPRETED: tl.constexpr = False,
):
    """out[m, n] for BLOCK_N consecutive n of one row m; the program reads its rows of W once
    (`_gemv_block`, program pid of the launch)."""
    _gemv_block(tl.program_id(0), tl.num_programs(0), x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, M, eps, ahead_ptr,
                N, K, NORM, GATED, RESIDUAL, BLOCK_N, BLOCK_K, EVEN_N, EVEN_K, PDL, EARLY, AHEAD_SLOTS, AHEAD_PARTS,
                AHEAD_BYTES, AHEAD_STRIDE, AHEAD_CHUNK, AHEAD_THREADS, INTERPRETED)


@triton.jit
def _gemv_block(
    pid, programs, x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr,
    M, eps, ahead_ptr,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr,
    AHEAD_SLOTS: tl.constexpr, AHEAD_PARTS: tl.constexpr, AHEAD_BYTES: tl.constexpr,
    AHEAD_STRIDE: tl.constexpr, AHEAD_CHUNK: tl.constexpr, AHEAD_THREADS: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Program `pid` of `programs` of the one-row GEMV: out[m, n] for BLOCK_N consecutive n of
    row m = pid % M; it reads its rows of W once.

    The first tile of W is loaded before waiting on the previous kernel: weights are never
    written, so under programmatic dependent launch the read starts while that kernel finishes.

    EARLY issues every load that does not wait on a reduction at once: the residual right after
    the wait, beside the input; and where K fits one tile, the norm weight before the wait and the
    input once for its norm and its products. Otherwise each is a further round trip to memory
    after a reduction.

    AHEAD_SLOTS > 0: once its own weights are in, each of the last AHEAD_SLOTS programs asks L2
    for its share of the next kernel's weight (`ahead._warm_l2`; the programs launched last ask
    first, so the requests land at the kernel's end).
    """
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
    _warm_l2(ahead_ptr, programs - 1 - pid, AHEAD_SLOTS, AHEAD_PARTS, AHEAD_BYTES, AHEAD_STRIDE,
             AHEAD_CHUNK, AHEAD_THREADS, INTERPRETED)
    y = tl.sum(acc, axis=1).to(dtype)
    if GATED:
        y = _silu_times(y, tl.sum(acc_up, axis=1).to(dtype), dtype)
    if RESIDUAL:
        if not EARLY:
            r = tl.load(res_ptr + m * N + offs_n, mask=mask_n, other=0.0)
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + m * N + offs_n, y.to(out_ptr.dtype.element_ty), mask=mask_n)


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
        last, acc, acc_up = _split_k_sums(part_ptr, arrivals_ptr, tile_m * tl.num_programs(0) + tile_n, split, acc,
                                          acc_up, BLOCK_M, BLOCK_N, SPLIT_K, GATED)
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
    ahead: torch.Tensor | None = None,
    ahead_gated: bool = False,
) -> torch.Tensor:
    """Same contract as `inferlab.fast.spec.gemv`: x [M, K], weight [N or 2N, K] -> [M, N].

    `ahead`, the weight of a kernel after this one (`ahead_gated`: a [gate; up] weight): with
    `policy.l2_ahead` > 0 the one-row and TMA kernels ask L2 for its first `policy.l2_ahead`
    bytes once their own weights are in (`inferlab.fast.kernels.ahead`). A hint: the result is
    the same.

    The kernel and its launch are `policy.rows_launch`'s: below `policy.rows_min_batch` rows
    `_gemv_kernel`, from there `_gemv_rows_kernel`; with `policy.batched == "cuda"`, 2 to
    `policy.cuda_max_rows` rows run `_gemv_batch_kernel`, with "rowwise" 2 to
    `policy.rowwise_max_rows` rows run it one row at a time in the one-row kernel's launch shape
    (`_rowwise_tile`); with "stream", from `policy.rows_min_batch` rows `_gemv_stream_kernel`; with
    "tma", from there `_gemv_tma_kernel` (the tensor-core kernel where the weight cannot have a
    TMA descriptor); a
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
        gemv_stream(operands, flags, config or launch.config or policy.stream_gemv, launch.target_programs,
                    launch.prefetch, policy.rows_block_m, policy.stream_per_sm, pdl,
                    policy.stream_tma and tma_fits(x, weight))
        return out
    if launch.kernel == "tma" and tma_fits(x, weight):
        gemv_tma(operands, flags, config or launch.config or policy.tma_gemv, launch.target_programs,
                 policy.rows_block_m, policy.tma_per_sm, pdl, max(launch.l2_tiles, policy.tma_prefetch), policy.tma_early,
                 ahead=ahead, ahead_gated=ahead_gated, ahead_limit=policy.l2_ahead, rms_at_once=policy.rms_at_once)
        return out
    if launch.kernel == "tma":  # no descriptor for this weight here: the tensor-core kernel
        launch = RowsLaunch("tensor", policy.rows_gemv, policy.rows_target_programs, policy.rows_prefetch)
        config = None
    if launch.kernel == "row":
        c = config or launch.config or policy.gemv_config(N, K, gated)
        programs = M * triton.cdiv(N, c.block_n)
        plan = ahead_plan(ahead, policy.l2_ahead, programs, 32 * c.num_warps, ahead_gated)
        ahead_ptr, ahead_flags = ahead_operands(ahead, plan, x)
        _gemv_kernel[(programs,)](
            *operands, ahead_ptr, **flags, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            EVEN_N=N % c.block_n == 0, EVEN_K=K % c.block_k == 0, EARLY=policy.early_loads,
            **ahead_flags, INTERPRETED=interpreted(),
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
