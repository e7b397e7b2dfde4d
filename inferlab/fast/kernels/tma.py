"""The batched projection with its weight tiles copied by the tensor memory accelerator (TMA,
Hopper and later): `LaunchPolicy(batched="tma")`.

`_gemv_rows_kernel` loads each weight tile with one address a thread (asynchronous copies that
every thread issues and waits on); here one thread hands the copy engine a tile's coordinates
(`TensorDescriptor`) and the tile lands in shared memory, so a program keeps its pipeline's stages
in flight with no registers spent on addresses. The products are swap-AB (`_swap_dot`: 64 weight
rows on the product's long side, Hopper's warpgroup product), and K is split until the matrix has
about `target_programs` programs, so that narrow matrices fill the GPU.

`gemv_tma` launches it; `inferlab.fast.kernels.projections.gemv` picks it by the policy and falls
back to the tensor-core kernel where a weight cannot have a descriptor (rows not 16-byte aligned).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from inferlab.fast.kernels.ahead import _warm_l2, ahead_operands, ahead_plan
from inferlab.fast.kernels.grid import interpreted
from inferlab.fast.kernels.launch import _launch_options, kept, multiprocessors, pdl_supported
from inferlab.fast.kernels.policy import LaunchConfig
from inferlab.fast.kernels.stream import _stream_epilogue, _swap_dot
from inferlab.fast.kernels.tiles import _input_rows, _split_k_sums, _wait_then_scales, rms_columns


@triton.jit
def _l2_lines(n0, k_first, ROWS: tl.constexpr, K: tl.constexpr, R: tl.constexpr, COLUMNS: tl.constexpr,
              LINE: tl.constexpr):
    """Offsets into W [ROWS, K] (row-major) of one element in every LINE-element line of rows
    n0 .. n0 + R and columns k_first .. k_first + COLUMNS, kept inside W (rows and columns past
    its edge are clamped to its last ones)."""
    rows = tl.minimum(n0 + tl.arange(0, R), ROWS - 1).to(tl.int64)
    cols = tl.minimum(k_first + tl.arange(0, COLUMNS // LINE) * LINE, K - 1)
    return rows[:, None] * K + cols[None, :]


@triton.jit
def _prefetch_l2(w_ptr, offsets, INTERPRETED: tl.constexpr):
    """Ask L2 for the lines of w_ptr + offsets (`prefetch.global.L2`, a hint that returns at once).
    Under the interpreter, which has no inline assembly, the same addresses are read instead."""
    if INTERPRETED:
        tl.load(w_ptr + offsets)
    else:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [w_ptr + offsets],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _gemv_tma_kernel(
    x_ptr, w_desc, w_ptr, norm_ptr, res_ptr, out_ptr, part_ptr, arrivals_ptr,
    M, eps, ahead_ptr,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, PDL: tl.constexpr, FP32: tl.constexpr, RMS_M: tl.constexpr, RMS_K: tl.constexpr,
    PREFETCH: tl.constexpr = 0, LINE: tl.constexpr = 64, INTERPRETED: tl.constexpr = False,
    EARLY: tl.constexpr = False, RMS_AT_ONCE: tl.constexpr = False,
    AHEAD_SLOTS: tl.constexpr = 0, AHEAD_PARTS: tl.constexpr = 1, AHEAD_BYTES: tl.constexpr = 0,
    AHEAD_STRIDE: tl.constexpr = 0, AHEAD_CHUNK: tl.constexpr = 16, AHEAD_THREADS: tl.constexpr = 1,
):
    """out[m, n] for BLOCK_M rows m and BLOCK_N consecutive n, the weight tiles read through
    `w_desc` (a TMA descriptor of W [N or 2N, K] in tiles [BLOCK_N, BLOCK_K]; tiles past its edge
    read as zeros).

    Program (tile_n, split, tile_m) sums the TILES_PER_SPLIT = ceil(K_TILES / SPLIT_K) K tiles
    from split * TILES_PER_SPLIT (a trip count known to the compiler; the last range's tiles past
    K are read as zeros, which the copy engine does without touching memory, and the host picks
    SPLIT_K so that no range is empty: `tma_split_k`). With SPLIT_K > 1 each stores its float32 partial sums and
    counts itself in `arrivals`; the last to arrive adds the partial sums in split order (the same
    result whatever the arrival order), applies the epilogue and resets the count to 0.

    PREFETCH > 0 asks L2 for the program's first PREFETCH weight tiles before waiting on the
    previous kernel (weights are never written), one request per LINE elements (128 bytes), as
    the one-row kernel loads its first tile there: the copies after the wait then find them on
    chip or on the way.

    EARLY copies the program's first weight tile (and its up tile) into shared memory before the
    wait, as the one-row kernel loads its first tile there, and multiplies it once the rows are
    in; the loop then runs over the others. The tiles are summed in the same order either way.

    RMS_AT_ONCE issues the loads of the rows' RMS pass all at once (`_rms_scales_wide`).

    AHEAD_SLOTS > 0: once its tiles are in, program p (counted over the whole grid) asks L2 for
    its share of the next kernel's weight (`ahead._warm_l2`).
    """
    tile_n = tl.program_id(0)
    split = tl.program_id(1)
    tile_m = tl.program_id(2)
    n0 = tile_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n, mask_m = offs_n < N, offs_m < M
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * K
    dtype = x_ptr.dtype.element_ty
    K_TILES: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    TILES_PER_SPLIT: tl.constexpr = (K_TILES + SPLIT_K - 1) // SPLIT_K
    k_first = split * (TILES_PER_SPLIT * BLOCK_K)
    if PREFETCH > 0:
        ROWS: tl.constexpr = 2 * N if GATED else N
        R: tl.constexpr = 64 if BLOCK_N > 64 else BLOCK_N  # rows a request tile, to keep it small
        for r in tl.static_range(0, BLOCK_N, R):
            _prefetch_l2(w_ptr, _l2_lines(n0 + r, k_first, ROWS, K, R, PREFETCH * BLOCK_K, LINE), INTERPRETED)
            if GATED:
                _prefetch_l2(w_ptr, _l2_lines(n0 + N + r, k_first, ROWS, K, R, PREFETCH * BLOCK_K, LINE), INTERPRETED)
    if EARLY:
        w_first = w_desc.load([n0, k_first])
        if GATED:
            up_first = w_desc.load([n0 + N, k_first])
    scale = _wait_then_scales(x_ptr, tile_m * BLOCK_M, M, eps, K, BLOCK_M, RMS_M, RMS_K, NORM, PDL, RMS_AT_ONCE)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    FIRST: tl.constexpr = 1 if EARLY else 0
    if EARLY:
        xv = _input_rows(x_rows, mask_m, norm_ptr, k_first + tl.arange(0, BLOCK_K), scale, K, NORM, dtype).to(dtype)
        acc = _swap_dot(w_first, xv, acc, FP32)
        if GATED:
            acc_up = _swap_dot(up_first, xv, acc_up, FP32)
    for i in range(FIRST, TILES_PER_SPLIT):
        k0 = k_first + i * BLOCK_K
        xv = _input_rows(x_rows, mask_m, norm_ptr, k0 + tl.arange(0, BLOCK_K), scale, K, NORM, dtype).to(dtype)
        acc = _swap_dot(w_desc.load([n0, k0]), xv, acc, FP32)  # W tile [BLOCK_N, BLOCK_K]
        if GATED:  # the up rows sit N rows below the gate rows; gate rows past N are never stored
            acc_up = _swap_dot(w_desc.load([n0 + N, k0]), xv, acc_up, FP32)
    slot = (tile_m * tl.num_programs(1) + split) * tl.num_programs(0) + tile_n
    _warm_l2(ahead_ptr, slot, AHEAD_SLOTS, AHEAD_PARTS, AHEAD_BYTES, AHEAD_STRIDE, AHEAD_CHUNK, AHEAD_THREADS,
             INTERPRETED)
    last = True
    if SPLIT_K > 1:
        last, acc, acc_up = _split_k_sums(part_ptr, arrivals_ptr, tile_m * tl.num_programs(0) + tile_n, split, acc,
                                          acc_up, BLOCK_N, BLOCK_M, SPLIT_K, GATED)
    if last:
        _stream_epilogue(acc, acc_up, offs_n, offs_m, mask_n, mask_m, res_ptr, out_ptr, N, GATED, RESIDUAL, dtype)


def tma_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `weight` can be read through a TMA descriptor here: on a Hopper or later GPU (or
    under Triton's interpreter, on the CPU), with its rows 16-byte aligned."""
    if x.device.type == "cuda" and not pdl_supported(x.device):  # Hopper or later (capability read once)
        return False
    return weight.data_ptr() % 16 == 0 and (weight.shape[1] * weight.element_size()) % 16 == 0


def tma_split_k(tiles: int, k_tiles: int, target_programs: int) -> int:
    """Ranges of K for `tiles` output tiles: about `target_programs` programs in all (any count,
    not only powers of two), at most one range per K tile, at least 1; then as few as cover K in
    ranges of ceil(k_tiles / ranges) tiles, so that none is empty."""
    wanted = max(1, min(k_tiles, target_programs // max(tiles, 1)))
    return -(-k_tiles // -(-k_tiles // wanted))


def tma_prefetch_tiles(wanted: int, k_tiles: int, split_k: int) -> int:
    """Weight tiles a program asks of L2 before the wait: `wanted`, at most its range's
    (ceil(k_tiles / split_k)), rounded down to a power of two (a request tile's columns)."""
    tiles = min(wanted, -(-k_tiles // split_k))
    return 1 << (tiles.bit_length() - 1) if tiles > 0 else 0


def _tma_scratch(device: torch.device, tiles: int, split_k: int, block_m: int, block_n: int) -> tuple:
    """Partial sums ([gate and up] for each tile and range) and arrival counts for the split kernel."""
    return kept(("tma-split-k", device, tiles, split_k, block_m, block_n), lambda: (
        torch.empty(tiles * split_k * 2 * block_m * block_n, device=device, dtype=torch.float32),
        torch.zeros(tiles, device=device, dtype=torch.int32)))


def gemv_tma(operands: tuple, flags: dict, config: LaunchConfig, target_programs: int, block_m: int, per_sm: int,
             pdl: bool, prefetch: int = 0, early: bool = False, ahead: torch.Tensor | None = None,
             ahead_gated: bool = False, ahead_limit: int = 0, rms_at_once: bool = False) -> None:
    """Launch `_gemv_tma_kernel` on `gemv`'s operands (x, weight, norm, residual, out, M, eps) and
    flags, K split until about `target_programs` programs (0: `per_sm` per SM), the first
    `prefetch` weight tiles of each program asked of L2 before the wait (at most its range's),
    with `early` its first tile copied into shared memory before the wait, and the first
    `ahead_limit` bytes of `ahead` (the next kernel's weight) asked of L2 after the loop; with
    `rms_at_once` the RMS pass's loads issued at once."""
    x, weight, M = operands[0], operands[1], operands[5]
    N, K = flags["N"], flags["K"]
    n_tiles, m_tiles = triton.cdiv(N, config.block_n), triton.cdiv(M, block_m)
    target = target_programs or per_sm * multiprocessors(x.device)
    split_k = tma_split_k(n_tiles * m_tiles, triton.cdiv(K, config.block_k), target)
    part, arrivals = (operands[4], operands[4]) if split_k == 1 else _tma_scratch(
        x.device, n_tiles * m_tiles, split_k, block_m, config.block_n)
    desc = TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k])
    rms_m = min(block_m, triton.next_power_of_2(M))  # rows a tile can hold
    prefetch = tma_prefetch_tiles(prefetch, triton.cdiv(K, config.block_k), split_k)
    line = min(128 // weight.element_size(), max(prefetch, 1) * config.block_k)  # elements a request
    plan = ahead_plan(ahead, ahead_limit, n_tiles * split_k * m_tiles, 32 * config.num_warps, ahead_gated)
    ahead_ptr, ahead_flags = ahead_operands(ahead, plan, x)
    _gemv_tma_kernel[(n_tiles, split_k, m_tiles)](
        x, desc, weight, *operands[2:5], part, arrivals, *operands[5:], ahead_ptr, **flags, **ahead_flags,
        BLOCK_M=block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split_k, FP32=weight.dtype == torch.float32,
        RMS_M=rms_m, RMS_K=rms_columns(rms_m, K), PREFETCH=prefetch, LINE=line, INTERPRETED=interpreted(), EARLY=early,
        RMS_AT_ONCE=rms_at_once,
        num_warps=config.num_warps, num_stages=config.num_stages, **_launch_options(pdl),
    )
