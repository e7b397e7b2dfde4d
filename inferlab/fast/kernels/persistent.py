"""Every decoder layer of a batch-1 decode step in one persistent kernel (`LaunchPolicy(persistent=True)`).

A step of L layers is 5 L phases: [q; k; v] with RMSNorm, attention (RoPE, the cache write),
o with the residual add, [gate; up] with RMSNorm and SiLU x up, down with the residual add, the
same work as the per-layer kernels. Instead of a kernel each, one kernel of about one program
per SM runs them all: each phase hands its tiles out to the programs in turn, and between two
phases the programs meet at a grid barrier, an arrival count in global memory, where a kernel
boundary would be. Before it waits, a program loads its first weight tile of the next phase
(weights are never written), as programmatic dependent launch does at a kernel boundary.

A grid barrier needs every program resident at once, so the grid is at most what the GPU holds
(`resident_programs`, from the compiled kernel's registers and shared memory). A program that
waits too long (`SPIN_LIMIT` polls) counts an error instead of hanging, and every later wait
gives up at once; `barrier_errors` reads the count. Under Triton's interpreter, which runs
programs one after another, a barrier would never open: there each phase is a launch of its own
(`SYNC=False`), the same code without the barriers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.fast.kernels.attention import _attend_cached, _rope
from inferlab.fast.kernels.grid import SPIN_LIMIT, _grid_arrive, _grid_wait, interpreted, wait_errors
from inferlab.fast.kernels.launch import kept, multiprocessors
from inferlab.fast.kernels.tiles import _silu_times

PHASES = 5  # a layer: [q; k; v], attention, o, [gate; up], down
REGISTERS_PER_SM, SHARED_PER_SM, THREADS_PER_SM = 65536, 228 * 1024, 2048  # Hopper


@triton.jit
def _weight_block(w_ptr, rows, offs_k, mask_n, K: tl.constexpr, EVEN_K: tl.constexpr):
    """W[rows, offs_k], zero for rows past N (mask_n) and columns past K."""
    if EVEN_K:
        return tl.load(w_ptr + rows + offs_k[None, :], mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
    mask = mask_n[:, None] & (offs_k[None, :] < K)
    return tl.load(w_ptr + rows + offs_k[None, :], mask=mask, other=0.0, eviction_policy="evict_first")


@triton.jit
def _shared_row(x_ptr, offs_k, K: tl.constexpr):
    """x[offs_k] of a vector another program wrote in an earlier phase: read from L2 (.cg), past
    the SM's own L1, which may still hold what it read there before."""
    return tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0, cache_modifier=".cg")


@triton.jit
def _rms_scale_shared(x_ptr, eps, K: tl.constexpr, BLOCK_K: tl.constexpr):
    total = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        v = _shared_row(x_ptr, k0 + tl.arange(0, BLOCK_K), K).to(tl.float32)
        total += v * v
    return 1.0 / tl.sqrt(tl.sum(total, axis=0) / K + eps)


@triton.jit
def _input_block(x_ptr, norm_ptr, offs_k, scale, K: tl.constexpr, NORM: tl.constexpr, dtype):
    """x[offs_k] as float32 [1, BLOCK_K]; RMS-normalized and times the norm weight when NORM."""
    return _normalized(_shared_row(x_ptr, offs_k, K), norm_ptr, offs_k, scale, K, NORM, dtype)


@triton.jit
def _normalized(xv, norm_ptr, offs_k, scale, K: tl.constexpr, NORM: tl.constexpr, dtype):
    """The block xv = x[offs_k] as float32 [1, BLOCK_K]; RMS-normalized and times the norm weight
    when NORM, rounded to `dtype` after each product as the specification rounds them."""
    if NORM:
        xv = (xv.to(tl.float32) * scale).to(dtype)
        g = tl.load(norm_ptr + offs_k, mask=offs_k < K, other=0.0)
        xv = (g.to(tl.float32) * xv.to(tl.float32)).to(dtype)
    return xv.to(tl.float32)[None, :]


@triton.jit
def _gemv_tile(x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, w, u, xf, tile, scale,
               N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[n] for the BLOCK_N rows n of `tile`, given its first K block of weights w (and u, the
    up rows, when GATED) and of the input, xf [1, BLOCK_K] (the same for every tile): what
    `_gemv_kernel` computes for one row."""
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    rows = offs_n.to(tl.int64)[:, None] * K
    up_rows = (offs_n + N).to(tl.int64)[:, None] * K
    dtype = w_ptr.dtype.element_ty
    acc = w.to(tl.float32) * xf
    acc_up = acc
    if GATED:
        acc_up = u.to(tl.float32) * xf
    for k0 in range(BLOCK_K, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        xf = _input_block(x_ptr, norm_ptr, offs_k, scale, K, NORM, dtype)
        acc += _weight_block(w_ptr, rows, offs_k, mask_n, K, EVEN_K).to(tl.float32) * xf
        if GATED:
            acc_up += _weight_block(w_ptr, up_rows, offs_k, mask_n, K, EVEN_K).to(tl.float32) * xf
    y = tl.sum(acc, axis=1).to(dtype)
    if GATED:
        y = _silu_times(y, tl.sum(acc_up, axis=1).to(dtype), dtype)
    if RESIDUAL:
        r = tl.load(res_ptr + offs_n, mask=mask_n, other=0.0, cache_modifier=".cg")
        y = (r.to(tl.float32) + y.to(tl.float32)).to(dtype)
    tl.store(out_ptr + offs_n, y, mask=mask_n)


@triton.jit
def _gemv_phase(x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, eps, pid, bar_ptr, err_ptr, target,
                N: tl.constexpr, K: tl.constexpr, NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
                NPROG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SYNC: tl.constexpr,
                SPIN: tl.constexpr):
    """out = W x (normed, gated, plus the residual as the flags say), tiles of BLOCK_N rows handed
    out to the programs in turn; the first tile's first weights loaded before the barrier."""
    TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    w = _weight_block(w_ptr, offs_n.to(tl.int64)[:, None] * K, offs_k, offs_n < N, K, EVEN_K)
    u = w
    if GATED:
        u = _weight_block(w_ptr, (offs_n + N).to(tl.int64)[:, None] * K, offs_k, offs_n < N, K, EVEN_K)
    if SYNC:
        _grid_wait(bar_ptr, err_ptr, target, SPIN)  # from here on, the last phase's writes are visible
    xv = _shared_row(x_ptr, offs_k, K)  # the input's first block: one read for every tile, and
    scale = 1.0                         # where K fits it, for the RMS scale too
    if NORM:
        if K <= BLOCK_K:
            v = xv.to(tl.float32)
            scale = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / K + eps)
        else:
            scale = _rms_scale_shared(x_ptr, eps, K, BLOCK_K)
    xf = _normalized(xv, norm_ptr, offs_k, scale, K, NORM, w_ptr.dtype.element_ty)
    if pid < TILES:
        _gemv_tile(x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, w, u, xf, pid, scale, N, K, NORM, GATED, RESIDUAL,
                   BLOCK_N, BLOCK_K)
    tile = pid + NPROG
    while tile < TILES:
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        w = _weight_block(w_ptr, offs_n.to(tl.int64)[:, None] * K, offs_k, offs_n < N, K, EVEN_K)
        u = w
        if GATED:
            u = _weight_block(w_ptr, (offs_n + N).to(tl.int64)[:, None] * K, offs_k, offs_n < N, K, EVEN_K)
        _gemv_tile(x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr, w, u, xf, tile, scale, N, K, NORM, GATED, RESIDUAL,
                   BLOCK_N, BLOCK_K)
        tile += NPROG


@triton.jit
def _attention_phase(qkv_ptr, cos_ptr, sin_ptr, pos, k_ptr, v_ptr, out_ptr, pid, bar_ptr, err_ptr, target,
                     stride_ch, stride_ct, scale,
                     NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, BLOCK_T: tl.constexpr,
                     NPROG: tl.constexpr, SYNC: tl.constexpr, SPIN: tl.constexpr):
    """One query head per program in turn: what `_attention_decode_kernel` computes without ranges
    (RoPE on q and k, the cache write by one head of each group, softmax(q K^T) V over [0, pos])."""
    G: tl.constexpr = NH // KVH
    HALF: tl.constexpr = HD // 2
    dtype = k_ptr.dtype.element_ty
    d = tl.arange(0, HD)
    partner = (d + HALF) % HD
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    if SYNC:
        _grid_wait(bar_ptr, err_ptr, target, SPIN)
    h = pid
    while h < NH:
        kv = h // G
        cache_at = kv * stride_ch
        q_at = qkv_ptr + h * HD
        q = _rope(tl.load(q_at + d, cache_modifier=".cg").to(tl.float32),
                  tl.load(q_at + partner, cache_modifier=".cg").to(tl.float32), cos, sin, d, HALF)
        q = q.to(dtype).to(tl.float32)
        k_at = qkv_ptr + (NH + kv) * HD
        k = _rope(tl.load(k_at + d, cache_modifier=".cg").to(tl.float32),
                  tl.load(k_at + partner, cache_modifier=".cg").to(tl.float32), cos, sin, d, HALF).to(dtype)
        v = tl.load(qkv_ptr + (NH + KVH + kv) * HD + d, cache_modifier=".cg").to(dtype)
        if h % G == 0:  # one writer per KV head; the other heads take the new token from registers
            tl.store(k_ptr + cache_at + pos * stride_ct + d, k)
            tl.store(v_ptr + cache_at + pos * stride_ct + d, v)
        best = tl.sum(q * k.to(tl.float32), axis=0) * scale
        total = best * 0.0 + 1.0
        acc = v.to(tl.float32)
        # the positions before this step's, written by earlier launches
        first = tl.zeros([], dtype=tl.int32)  # a tensor: the loop changes it
        best, total, acc = _attend_cached(k_ptr, v_ptr, cache_at, stride_ct, d, q, scale, best, total, acc, first, pos,
                                          BLOCK_T)
        tl.store(out_ptr + h * HD + d, (acc / total).to(dtype))
        h += NPROG


@triton.jit
def _decode_layers_kernel(
    hidden_ptr, xs_ptr, qkv_ptr, attn_ptr, h_ptr,
    wqkv_ptr, wo_ptr, w13_ptr, w2_ptr, norm1_ptr, norm2_ptr,
    cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, bar_ptr, err_ptr,
    phase_first, phase_last, stride_cl, stride_ch, stride_ct, eps, scale,
    H: tl.constexpr, I: tl.constexpr, NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr,
    NPROG: tl.constexpr, BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, BN_O: tl.constexpr, BK_O: tl.constexpr,
    BN_13: tl.constexpr, BK_13: tl.constexpr, BN_2: tl.constexpr, BK_2: tl.constexpr,
    BLOCK_T: tl.constexpr, SYNC: tl.constexpr, SPIN: tl.constexpr,
):
    """Phases [phase_first, phase_last) of the step: hidden [H] in (the token's embedding), the
    residual stream xs [H] out; qkv, attn and h are scratch between phases. The weights are the
    layers' stacks ([L, ...], one tensor per kind) and the caches [L, kvh, T, hd] of batch 1.

    With SYNC, the programs meet at a barrier after each phase: the count at bar_ptr reaches
    NPROG per phase, and the last program to arrive after the last phase resets it to 0 for the
    next launch (every other program is past its last wait by then)."""
    pid = tl.program_id(0)
    pos = tl.load(pos_ptr)
    NQKV: tl.constexpr = (NH + 2 * KVH) * HD
    NA: tl.constexpr = NH * HD
    phase = phase_first
    while phase < phase_last:
        layer = (phase // 5).to(tl.int64)
        kind = phase % 5
        target = (phase - phase_first) * NPROG
        x_ptr = xs_ptr
        if layer == 0:
            x_ptr = hidden_ptr  # the first layer reads the embedding; every later phase the stream
        if kind == 0:
            _gemv_phase(x_ptr, wqkv_ptr + layer * (NQKV * H), norm1_ptr + layer * H, x_ptr, qkv_ptr, eps, pid,
                        bar_ptr, err_ptr, target, NQKV, H, True, False, False, NPROG, BN_QKV, BK_QKV, SYNC, SPIN)
        elif kind == 1:
            _attention_phase(qkv_ptr, cos_ptr, sin_ptr, pos, k_ptr + layer * stride_cl, v_ptr + layer * stride_cl,
                             attn_ptr, pid, bar_ptr, err_ptr, target, stride_ch, stride_ct, scale, NH, KVH, HD,
                             BLOCK_T, NPROG, SYNC, SPIN)
        elif kind == 2:
            _gemv_phase(attn_ptr, wo_ptr + layer * (H * NA), norm1_ptr, x_ptr, xs_ptr, eps, pid,
                        bar_ptr, err_ptr, target, H, NA, False, False, True, NPROG, BN_O, BK_O, SYNC, SPIN)
        elif kind == 3:
            _gemv_phase(xs_ptr, w13_ptr + layer * (2 * I * H), norm2_ptr + layer * H, xs_ptr, h_ptr, eps, pid,
                        bar_ptr, err_ptr, target, I, H, True, True, False, NPROG, BN_13, BK_13, SYNC, SPIN)
        else:
            _gemv_phase(h_ptr, w2_ptr + layer * (H * I), norm2_ptr, xs_ptr, xs_ptr, eps, pid,
                        bar_ptr, err_ptr, target, H, I, False, False, True, NPROG, BN_2, BK_2, SYNC, SPIN)
        if SYNC:
            if phase + 1 < phase_last:
                _grid_arrive(bar_ptr)
        phase += 1
    if SYNC:
        tl.debug_barrier()
        if tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") == (phase_last - phase_first) * NPROG - 1:
            tl.atomic_xchg(bar_ptr, 0)


def tile_shape(n: int, k: int, programs: int, gated: bool, elements: int = 4096) -> tuple[int, int]:
    """(rows, columns) of a weight tile for an [n, k] matrix (n rows per half when gated) over
    `programs` programs: the fewest rows, a power of two up to 64, that give each program at most
    one tile; then all of K (rounded up to a power of two) where the products a program keeps,
    rows x columns (twice when gated), are at most twice `elements`, so that the input is read
    once; else columns such that they are at most `elements` floats (16 registers a thread over
    8 warps), at least 32."""
    rows = max(1, min(64, triton.next_power_of_2(-(-n // programs))))
    halves = 2 if gated else 1
    if rows * triton.next_power_of_2(k) * halves <= 2 * elements:
        return rows, triton.next_power_of_2(k)  # all of K in one block: the input read once, its norm from it
    columns = 1 << ((elements // (rows * halves)).bit_length() - 1)  # a power of two at most that
    return rows, max(32, min(triton.next_power_of_2(k), columns))


def resident_programs(sms: int, per_sm: int, registers: int, warps: int, shared: int) -> int:
    """Programs that are sure to run at once: `per_sm` a multiprocessor, fewer if a program's
    registers (per thread, allocated in units of 8), threads or shared memory do not fit that many."""
    threads = warps * 32
    by_registers = REGISTERS_PER_SM // (max(8, -(-registers // 8) * 8) * threads)
    by_threads = THREADS_PER_SM // threads
    by_shared = SHARED_PER_SM // shared if shared else per_sm
    return sms * max(1, min(per_sm, by_registers, by_threads, by_shared))


def _barrier(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The grid barrier's arrival count (0 between launches) and the count of waits that gave up."""
    count, = kept(("persistent-barrier", device), lambda: (torch.zeros(1, device=device, dtype=torch.int32),))
    return count, wait_errors(device)


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
    *,
    per_sm: int = 1,
    programs: int | None = None,
    block_t: int = 64,
    num_warps: int = 8,
    tile_elements: int = 4096,
) -> torch.Tensor:
    """hidden [1, H] through every layer -> the residual stream [1, H] after the last (before the
    final norm), as `inferlab.fast.spec`'s per-layer operations compute it, in one launch.

    stacks: (wqkv [L, (nh + 2 kvh) hd, H], wo [L, H, nh hd], w13 [L, 2 I, H], w2 [L, H, I],
    attn_norm [L, H], ffn_norm [L, H]); k_cache, v_cache [L, 1, kvh, T, hd], written at `position`.
    On a GPU the grid is `per_sm` programs a multiprocessor, fewer if the compiled kernel does
    not fit that many (`resident_programs`); under the interpreter `programs` (default 3), one
    launch per phase. 8 warps a program and tiles of `tile_elements` products (`tile_shape`): for
    SmolLM2's and TinyLlama's shapes, no spill on sm_90 (`inferlab.fast.aot`)."""
    wqkv, wo, w13, w2, norm1, norm2 = stacks
    L, NQKV, H = wqkv.shape
    inner = w2.shape[2]
    hd = k_cache.shape[-1]
    assert hidden.shape == (1, H) and k_cache.shape[1] == 1 and NQKV == (num_heads + 2 * num_kv_heads) * hd
    assert all(t.is_contiguous() for t in (hidden, *stacks, k_cache, v_cache))
    device = hidden.device
    xs = torch.empty_like(hidden)
    qkv, attn, h = kept(("persistent", device, hidden.dtype, NQKV, num_heads * hd, inner), lambda: (
        torch.empty(NQKV, device=device, dtype=hidden.dtype), torch.empty(num_heads * hd, device=device, dtype=hidden.dtype),
        torch.empty(inner, device=device, dtype=hidden.dtype)))
    bar, err = _barrier(device)
    operands = (hidden, xs, qkv, attn, h, wqkv, wo, w13, w2, norm1, norm2, cos, sin, position, k_cache, v_cache, bar, err)
    strides = (k_cache.stride(0), k_cache.stride(2), k_cache.stride(3), eps, hd**-0.5)

    def flags(nprog: int) -> dict:
        shapes = {"QKV": tile_shape(NQKV, H, nprog, False, tile_elements),
                  "O": tile_shape(H, num_heads * hd, nprog, False, tile_elements),
                  "13": tile_shape(inner, H, nprog, True, tile_elements), "2": tile_shape(H, inner, nprog, False, tile_elements)}
        return dict(H=H, I=inner, NH=num_heads, KVH=num_kv_heads, HD=hd, NPROG=nprog, BLOCK_T=block_t, SPIN=SPIN_LIMIT,
                    num_warps=num_warps, **{f"BN_{m}": s[0] for m, s in shapes.items()},
                    **{f"BK_{m}": s[1] for m, s in shapes.items()})

    if interpreted():  # programs run one after another here: a barrier would never open
        nprog = programs or 3
        for phase in range(PHASES * L):
            _decode_layers_kernel[(nprog,)](*operands, phase, phase + 1, *strides, SYNC=False, **flags(nprog))
        return xs
    nprog = programs or kept(("persistent-grid", device, per_sm, num_warps, L, NQKV, H, inner), lambda: (
        _grid(operands, strides, PHASES * L, flags, device, per_sm, num_warps),))[0]
    _decode_layers_kernel[(nprog,)](*operands, 0, PHASES * L, *strides, SYNC=True, **flags(nprog))
    return xs


def _grid(operands, strides, phases, flags, device, per_sm: int, num_warps: int) -> int:
    """SMs x per_sm programs, fewer per SM until the compiled kernel fits them all at once."""
    sms = multiprocessors(device)
    for want in range(per_sm, 0, -1):
        nprog = sms * want
        compiled = _decode_layers_kernel.warmup(*operands, 0, phases, *strides, SYNC=True, **flags(nprog), grid=(nprog,))
        compiled._init_handles()
        if resident_programs(sms, want, compiled.n_regs, num_warps, compiled.metadata.shared) >= nprog:
            return nprog
    raise ValueError("the persistent decode kernel does not fit one program per SM: use LaunchPolicy(persistent=False)")
