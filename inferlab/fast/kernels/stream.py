"""The stream-K projection: the tensor-core products of `_gemv_rows_kernel` with each matrix's work
cut evenly between a fixed number of programs, whatever its shape (`LaunchPolicy(batched="stream")`).

`gemv_stream` launches it; `inferlab.fast.kernels.projections.gemv` picks it by the policy. Off by
default: alone it beats the tensor-core kernel on every TinyLlama matrix at 4 rows, but in the
decode step, where each kernel starts while the one before drains, it does not
(docs/perf/h100/stream-k.md).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from inferlab.fast.kernels.launch import _launch_options, kept, multiprocessors
from inferlab.fast.kernels.policy import LaunchConfig
from inferlab.fast.kernels.tiles import _input_rows, _silu_times, _wait_then_scales, rms_columns


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
def _stream_epilogue(acc, acc_up, offs_n, offs_m, mask_n, mask_m, res_ptr, out_ptr, N: tl.constexpr,
                     GATED: tl.constexpr, RESIDUAL: tl.constexpr, dtype):
    """out[m, n] from the sums acc [BLOCK_N, BLOCK_M] (and acc_up when GATED) over the whole of K."""
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
def _stream_slot(part_ptr, tile, p, acc, acc_up, UNITS: tl.constexpr, PROGRAMS: tl.constexpr,
                 K_TILES: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GATED: tl.constexpr, N_TILES: tl.constexpr):
    """Store program p's partial sums of `tile` (an index over row tiles and weight tiles) in its slot."""
    PART: tl.constexpr = 2 * BLOCK_N * BLOCK_M
    cell = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    owner = _stream_owner((tile % N_TILES) * K_TILES, UNITS, PROGRAMS)
    slot = part_ptr + (tile * SLOTS + p - owner).to(tl.int64) * PART
    tl.store(slot + cell, acc)
    if GATED:
        tl.store(slot + BLOCK_N * BLOCK_M + cell, acc_up)


@triton.jit
def _stream_arrive(part_ptr, arrivals_ptr, tile, offs_m, mask_m, res_ptr, out_ptr, N: tl.constexpr,
                   GATED: tl.constexpr, RESIDUAL: tl.constexpr, UNITS: tl.constexpr, PROGRAMS: tl.constexpr,
                   K_TILES: tl.constexpr, N_TILES: tl.constexpr, SLOTS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, dtype):
    """Count this program's slot of `tile` as written; the last of the tile's programs to arrive
    adds every slot in order, applies the epilogue and resets the count to 0."""
    PART: tl.constexpr = 2 * BLOCK_N * BLOCK_M
    t = tile % N_TILES
    owner = _stream_owner(t * K_TILES, UNITS, PROGRAMS)
    owners = _stream_owner(t * K_TILES + K_TILES - 1, UNITS, PROGRAMS) - owner + 1
    tl.debug_barrier()  # every thread's partial sums are written before the count says so
    if tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel") == owners - 1:
        tl.debug_barrier()
        cell = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for s in range(SLOTS):  # the tile's `owners` slots, in order
            slot = part_ptr + (tile * SLOTS + s).to(tl.int64) * PART
            used = s < owners
            acc += tl.load(slot + cell, mask=used, other=0.0, cache_modifier=".cg")
            if GATED:
                acc_up += tl.load(slot + BLOCK_N * BLOCK_M + cell, mask=used, other=0.0, cache_modifier=".cg")
        tl.atomic_xchg(arrivals_ptr + tile, 0)
        offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        _stream_epilogue(acc, acc_up, offs_n, offs_m, offs_n < N, mask_m, res_ptr, out_ptr, N, GATED, RESIDUAL,
                         dtype)


@triton.jit
def _stream_weights(w_ptr, w_desc, u, live, N: tl.constexpr, K: tl.constexpr, K_TILES: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr,
                    TMA: tl.constexpr):
    """Unit u's weight tile [BLOCK_N, BLOCK_K] (and its up tile when GATED; else the same tile),
    zero when not `live`; with the unit's weight rows, their mask and its columns. TMA copies the
    tiles through the descriptor `w_desc` instead (a unit not live is asked for past the weight's
    last row, which the copy engine answers with zeros and no memory traffic)."""
    t = u // K_TILES
    offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    k0 = (u - t * K_TILES) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    if TMA:
        ROWS: tl.constexpr = 2 * N if GATED else N
        row = tl.where(live, t * BLOCK_N, ROWS)
        w = w_desc.load([row, k0])
        up = w
        if GATED:
            up = w_desc.load([tl.where(live, t * BLOCK_N + N, ROWS), k0])
    else:
        w = _unit_tile(w_ptr, offs_n, offs_k, mask_n & live, K, EVEN_K)
        up = w
        if GATED:
            up = _unit_tile(w_ptr, offs_n + N, offs_k, mask_n & live, K, EVEN_K)
    return w, up, offs_n, mask_n, offs_k


@triton.jit
def _stream_products(w, up, x_rows, norm_ptr, offs_k, scale, live, mask_m, acc, acc_up, K: tl.constexpr,
                     NORM: tl.constexpr, GATED: tl.constexpr, FP32: tl.constexpr, dtype):
    """acc + w @ x tile^T (and acc_up + up @ x tile^T), x normalized (its rows' RMS `scale`, then
    the norm weight) and rounded as the specification rounds it when NORM."""
    xv = _input_rows(x_rows, mask_m & live, norm_ptr, offs_k, scale, K, NORM, dtype).to(dtype)
    acc = _swap_dot(w, xv, acc, FP32)
    if GATED:
        acc_up = _swap_dot(up, xv, acc_up, FP32)
    return acc, acc_up


@triton.jit
def _stream_unit_end(acc, acc_up, u, live, u_first, p, tile_m, offs_n, mask_n, offs_m, mask_m, part_ptr, res_ptr,
                     out_ptr, N: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr, UNITS: tl.constexpr,
                     PROGRAMS: tl.constexpr, K_TILES: tl.constexpr, N_TILES: tl.constexpr, SLOTS: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, dtype):
    """After unit u: where it ends its tile, the epilogue (the whole tile was this program's) or
    the partial sums into this program's slot (its first tile, begun by another), and the sums
    back to 0."""
    t = u // K_TILES
    if live & (u - t * K_TILES == K_TILES - 1):
        if u_first <= t * K_TILES:
            _stream_epilogue(acc, acc_up, offs_n, offs_m, mask_n, mask_m, res_ptr, out_ptr, N, GATED, RESIDUAL, dtype)
        else:
            _stream_slot(part_ptr, tile_m * N_TILES + t, p, acc, acc_up, UNITS, PROGRAMS, K_TILES, SLOTS, BLOCK_M,
                         BLOCK_N, GATED, N_TILES)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    return acc, acc_up


@triton.jit
def _gemv_stream_kernel(
    x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, part_ptr, arrivals_ptr,
    M, eps,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    PROGRAMS: tl.constexpr, SLOTS: tl.constexpr, PDL: tl.constexpr, FP32: tl.constexpr, PREFETCH: tl.constexpr,
    RMS_M: tl.constexpr, RMS_K: tl.constexpr, w_desc=None, TMA: tl.constexpr = False,
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

    With NORM each program first takes its rows' RMS scales (`_rms_scales_wide`: the RMS_M rows
    that can exist, RMS_K columns a load) and normalizes each x tile as the specification does.

    PREFETCH loads the first unit's weight tile before waiting on the previous kernel, as the
    one-row kernel does, and multiplies it once the input is in.

    TMA copies the weight tiles through `w_desc` (a TMA descriptor of W in tiles [BLOCK_N,
    BLOCK_K], as `inferlab.fast.kernels.tma` reads them) instead of one address a thread.
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
        w_first, up_first, offs_n, mask_n, offs_k = _stream_weights(w_ptr, w_desc, u_first, u_first < u_end, N, K,
                                                                    K_TILES, BLOCK_N, BLOCK_K, GATED, EVEN_K, TMA)
    scale = _wait_then_scales(x_ptr, tile_m * BLOCK_M, M, eps, K, BLOCK_M, RMS_M, RMS_K, NORM, PDL)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if PREFETCH:
        acc, acc_up = _stream_products(w_first, up_first, x_rows, norm_ptr, offs_k, scale, u_first < u_end, mask_m,
                                       acc, acc_up, K, NORM, GATED, FP32, dtype)
        acc, acc_up = _stream_unit_end(acc, acc_up, u_first, u_first < u_end, u_first, p, tile_m, offs_n, mask_n,
                                       offs_m, mask_m, part_ptr, res_ptr, out_ptr, N, GATED, RESIDUAL, UNITS,
                                       PROGRAMS, K_TILES, N_TILES, SLOTS, BLOCK_M, BLOCK_N, dtype)
    # a bound known to the compiler; a shorter range idles its last step
    for i in range(1 if PREFETCH else 0, STEPS):
        u = u_first + i
        live = u < u_end
        w, up, offs_n, mask_n, offs_k = _stream_weights(w_ptr, w_desc, u, live, N, K, K_TILES, BLOCK_N, BLOCK_K, GATED,
                                                        EVEN_K, TMA)
        acc, acc_up = _stream_products(w, up, x_rows, norm_ptr, offs_k, scale, live, mask_m, acc, acc_up, K, NORM,
                                       GATED, FP32, dtype)
        acc, acc_up = _stream_unit_end(acc, acc_up, u, live, u_first, p, tile_m, offs_n, mask_n, offs_m, mask_m,
                                       part_ptr, res_ptr, out_ptr, N, GATED, RESIDUAL, UNITS, PROGRAMS, K_TILES,
                                       N_TILES, SLOTS, BLOCK_M, BLOCK_N, dtype)
    t_first = u_first // K_TILES
    t_last = (u_end - 1) // K_TILES
    ends_inside = (u_end > u_first) & (u_end % K_TILES != 0)  # the last tile goes on in the next program
    if ends_inside:
        _stream_slot(part_ptr, tile_m * N_TILES + t_last, p, acc, acc_up, UNITS, PROGRAMS, K_TILES, SLOTS, BLOCK_M,
                     BLOCK_N, GATED, N_TILES)
    if (u_end > u_first) & (u_first % K_TILES != 0) & ((t_first < t_last) | (not ends_inside)):
        # the first tile was begun by another program and ended in this one's loop
        _stream_arrive(part_ptr, arrivals_ptr, tile_m * N_TILES + t_first, offs_m, mask_m, res_ptr, out_ptr, N,
                       GATED, RESIDUAL, UNITS, PROGRAMS, K_TILES, N_TILES, SLOTS, BLOCK_M, BLOCK_N, dtype)
    if ends_inside:
        _stream_arrive(part_ptr, arrivals_ptr, tile_m * N_TILES + t_last, offs_m, mask_m, res_ptr, out_ptr, N,
                       GATED, RESIDUAL, UNITS, PROGRAMS, K_TILES, N_TILES, SLOTS, BLOCK_M, BLOCK_N, dtype)


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
    """Partial-sum slots (acc, acc_up) and arrival counts for the stream-K kernel."""
    return kept(("stream-k", device, tiles, slots, block_m, block_n), lambda: (
        torch.empty(tiles * slots * 2 * block_n * block_m, device=device, dtype=torch.float32),
        torch.zeros(tiles, device=device, dtype=torch.int32)))


def gemv_stream(operands: tuple, flags: dict, config: LaunchConfig, target_programs: int, prefetch: bool,
                block_m: int, per_sm: int, pdl: bool, tma: bool = False) -> None:
    """Launch `_gemv_stream_kernel` on `gemv`'s operands (x, weight, norm, residual, out, M, eps)
    and flags: `target_programs` programs (0: `per_sm` per SM, at most one per unit); with `tma`,
    the weight tiles copied through a TMA descriptor."""
    x, weight, M = operands[0], operands[1], operands[5]
    N, K = flags["N"], flags["K"]
    n_tiles, k_tiles = triton.cdiv(N, config.block_n), triton.cdiv(K, config.block_k)
    m_tiles = triton.cdiv(M, block_m)
    programs = min(n_tiles * k_tiles, target_programs or per_sm * multiprocessors(x.device))
    slots = stream_slots(n_tiles, k_tiles, programs)
    part, arrivals = _stream_scratch(x.device, m_tiles * n_tiles, slots, block_m, config.block_n)
    rms_m = min(block_m, triton.next_power_of_2(M))  # rows a tile can hold
    _gemv_stream_kernel[(programs, m_tiles)](
        *operands[:5], part, arrivals, *operands[5:], **flags, BLOCK_M=block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, EVEN_K=K % config.block_k == 0, PROGRAMS=programs, SLOTS=slots,
        FP32=weight.dtype == torch.float32, PREFETCH=prefetch, RMS_M=rms_m, RMS_K=rms_columns(rms_m, K),
        w_desc=TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k]) if tma else None, TMA=tma,
        num_warps=config.num_warps, num_stages=config.num_stages, **_launch_options(pdl),
    )
