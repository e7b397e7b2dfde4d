"""Triton kernels for one decode step at small batch, implementing `inferlab.fast.spec`.

At batch 1 a decode step is a chain of matrix-vector products: the time is the time to read
the weights once, plus a fixed cost per kernel. These kernels cut both: each projection is
one kernel that reads its matrix exactly once with wide, coalesced loads, and carries the work
around it (RMSNorm before, SiLU*up or the residual add after) so that nothing else runs between
two projections except the attention kernel, which also does RoPE and the cache write. A layer
is five kernels (six when the cache holds more than one range of positions: the attention runs
over ranges of the context, merged by `_attention_combine_kernel`, or, with
`LaunchPolicy(head_combine="last")`, by the last range to finish); after the LM head, one more
picks the greedy token, fetches its embedding for the next step and advances the position
(`greedy_step`).

On Hopper and later GPUs the kernels are chained by programmatic dependent launch (PDL): each
one is launched while the previous one still runs, loads what does not depend on it (its first
weight tile; for attention the rotary tables and the first cache rows), and only then waits
for the previous kernel's results (``gdc_wait``). The greedy step kernel is launched without
PDL, so every decode step starts after the previous step has completely finished.

From ROWS_MIN_BATCH batch rows on, the projections run `_gemv_rows_kernel` instead: small matrix
products on the tensor cores that read each weight tile once for the whole batch.

Launch shapes (rows per program, K-tile, warps, pipelining depth) come from `gemv_config`,
measured per matrix shape on an H200 by ``perf_tests/scripts/kernel_configs.py``; other shapes
get the default row. Importing this module needs Triton; `inferlab.fast.engine` imports it only for
CUDA (or under ``TRITON_INTERPRET=1``, which runs the kernels on the CPU for tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import torch
import triton
import triton.language as tl

from inferlab.decode.sampling import SamplingConfig


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


DEFAULT_GEMV = LaunchConfig(block_n=8, block_k=256, num_warps=4, num_stages=3)
# (N, K, gated) -> config: the TinyLlama-1.1B matrices, measured on an H200 (docs/perf/h200/kernels.md).
MEASURED_GEMV: dict[tuple[int, int, bool], LaunchConfig] = {
    (2560, 2048, False): LaunchConfig(2, 1024, 4, 1),  # [q; k; v]
    (2048, 2048, False): LaunchConfig(2, 1024, 4, 1),  # o
    (5632, 2048, True): LaunchConfig(4, 2048, 4, 3),  # [gate; up]
    (2048, 5632, False): LaunchConfig(4, 2048, 4, 1),  # down
    (32000, 2048, False): LaunchConfig(4, 1024, 4, 3),  # lm head
}
ATTENTION_BLOCK_T = 128
# The split attention (`attention_decode_split`): positions per tile, and about one range of the
# context per SPLIT_POSITIONS cached positions, at most MAX_SPLITS ranges.
SPLIT_BLOCK_T, SPLIT_POSITIONS, MAX_SPLITS = 16, 32, 64
GREEDY_BLOCK_V, GREEDY_WARPS = 8192, 16


ATTENTION_KERNELS = {"head": "attention_decode", "split": "attention_decode_split"}
SPLIT_COMBINES = ("last", "kernel")

ROWS_GEMV = LaunchConfig(block_n=32, block_k=256, num_warps=4, num_stages=4)  # measured at batch 4 on the H200


@dataclass(frozen=True)
class LaunchPolicy:
    """Which GEMV kernel each call runs and with which launch shape: passed to the kernels, never patched in.

    Fewer than `rows_min_batch` rows run one program per output tile per row, with the shape
    `gemv[(n, k, gated)]` (else `default_gemv`); more rows run the tensor-core kernel, which reads
    each weight tile once for `rows_block_m` rows, with `rows_gemv`.
    """

    gemv: Mapping[tuple[int, int, bool], LaunchConfig] = field(default_factory=lambda: MappingProxyType(MEASURED_GEMV))
    default_gemv: LaunchConfig = DEFAULT_GEMV
    rows_min_batch: int = 4
    # "tensor": from rows_min_batch rows, the tensor-core kernel; "cuda": from 2 rows up to
    # cuda_max_rows, one program per weight block multiplies it into every row on the CUDA cores
    batched: str = "tensor"
    cuda_max_rows: int = 8
    rows_gemv: LaunchConfig = ROWS_GEMV
    rows_block_m: int = 16
    # the tensor-core kernel cuts K into ranges until its programs number about this many (0: never)
    rows_target_programs: int = 0
    # the tensor-core kernel loads its first weight tile before waiting on the previous kernel
    # (as the one-row kernel does); to be measured against waiting first
    rows_prefetch: bool = False
    # the batched kernels' RMS pass over their rows in wide tiles summed as they go
    # (`_rms_scales_wide`: 4 rows x 2048 columns in one load) instead of the products' K tiles
    # (16 rows x 256 columns, eight loads one after another for K = 2048). To be measured.
    wide_rms: bool = False
    # the one-row and CUDA-core projection kernels issue every load that does not wait on a
    # reduction at once (the residual beside the input; in the one-row kernel where K fits one
    # tile, also the norm weight before the wait and the input read once for its norm and its
    # products): one or two round trips to memory fewer per kernel (the kernels' EARLY). Not the
    # tensor-core kernel: a residual tile held across its loop spills. To be measured before it is
    # the default.
    early_loads: bool = False
    # "head": one program per query head (`attention_decode`); "split": one per KV head and range
    # of the context, combined in the kernel (`attention_decode_split`), with these tiles and ranges;
    # "auto": "split" for a cache of at least `split_min_cache` positions, else "head"
    attention: str = "head"
    head_block_t: int = ATTENTION_BLOCK_T  # cached positions per step of the per-head kernel's loop
    # > 0: the per-head kernel cuts the context into ranges of this many positions, merged by a
    # second kernel (`attention_decode`'s range_positions), where the cache holds more than one.
    # 128: on the H200 the fastest decode step at every context measured (TPOT at prompt 128 + 128
    # new 0.686 against 0.712 ms without ranges; + 500 new 0.697 against 0.813; prompt 1920 0.761
    # against 2.185), ahead of ranges of 256 and the split kernel (docs/perf/h200/kernels.md)
    head_range: int = 128
    # who merges the per-head kernel's ranges: "kernel", `_attention_combine_kernel` after it (one
    # kernel more a layer); "last", the last of each head's ranges to finish, in the same kernel
    # (an atomic count a program instead of a kernel boundary). To be measured before it is the default.
    head_combine: str = "kernel"
    split_block_t: int = SPLIT_BLOCK_T
    split_positions: int = SPLIT_POSITIONS
    max_splits: int = MAX_SPLITS
    # 2048: on an H100 the per-head kernel was still faster at 600 cached positions (12.9 against
    # 17.4 us), and a 1024-position cache (prompt 128 + 500 new) decoded faster with it (TPOT 0.99
    # against 1.12 ms); the split kernel won at 1024 positions and beyond (docs/perf/h100/README.md)
    split_min_cache: int = 2048
    # who combines the split attention's ranges: "last", the last program of each KV head to
    # finish, in the same kernel (one loop over the ranges, CHUNK at a time); "kernel", a second
    # kernel with one program per query head, all ranges loaded at once
    split_combine: str = "last"
    # how a sampled step ends: "torch", temperature, top-k and top-p with a sort, compiled by
    # inductor (0.089 ms a step on an H100 at vocabulary 32,000: docs/perf/h100/targets.md);
    # "kernel", `sample_step`, one kernel that finds the thresholds by bisection (vocabularies up
    # to SAMPLE_MAX_VOCAB; larger ones keep the torch step). To be measured before it is the default.
    sampling: str = "torch"

    def __post_init__(self) -> None:
        if self.batched not in ("tensor", "cuda"):
            raise ValueError(f"batched must be 'tensor' or 'cuda', not {self.batched!r}")
        if self.split_combine not in SPLIT_COMBINES:
            raise ValueError(f"split_combine must be one of {list(SPLIT_COMBINES)}, not {self.split_combine!r}")
        if self.head_combine not in SPLIT_COMBINES:
            raise ValueError(f"head_combine must be one of {list(SPLIT_COMBINES)}, not {self.head_combine!r}")
        if self.head_range < 0 or self.head_range % self.head_block_t:
            raise ValueError(f"head_range must be 0 or a multiple of head_block_t ({self.head_block_t}), "
                             f"not {self.head_range}")
        if self.sampling not in ("torch", "kernel"):
            raise ValueError(f"sampling must be 'torch' or 'kernel', not {self.sampling!r}")
        if self.attention not in (*ATTENTION_KERNELS, "auto"):
            raise ValueError(f"attention must be one of {sorted((*ATTENTION_KERNELS, 'auto'))}, not {self.attention!r}")

    def attention_for(self, cache_length: int) -> str:
        """"head" or "split": the attention this policy runs over a cache of `cache_length` positions."""
        if self.attention == "auto":
            return "split" if cache_length >= self.split_min_cache else "head"
        return self.attention

    def attention_kernel(self, cache_length: int) -> str:
        """The name of the function in this module that the policy's attention runs for that cache."""
        return ATTENTION_KERNELS[self.attention_for(cache_length)]

    def head_range_for(self, cache_length: int) -> int:
        """Positions per range of the per-head kernel over a cache of `cache_length` positions: 0
        (no ranges, no combine kernel) where the cache holds no more than one range."""
        return self.head_range if self.head_range and cache_length > self.head_range else 0

    def decode_kernels(self, layers: int, cache_length: int) -> int:
        """Kernels in one greedy decode step over a cache of `cache_length` positions: per layer
        the four projections and the attention, plus a combine kernel where one merges the
        attention's ranges; then the LM head and the greedy step kernel."""
        if self.attention_for(cache_length) == "split":
            combine = self.split_combine == "kernel"
        else:
            combine = bool(self.head_range_for(cache_length)) and self.head_combine == "kernel"
        return layers * (5 + combine) + 2

    def gemv_config(self, n: int, k: int, gated: bool) -> LaunchConfig:
        """The launch shape for an [n, k] matrix (n rows per half when gated) at few rows."""
        return self.gemv.get((n, k, gated), self.default_gemv)


DEFAULT_POLICY = LaunchPolicy()
# The variants being measured (engine "fast-split"): attention split over the context, and
# split-K until a batched projection has about two programs per SM of an H100/H200 (132 SMs).
SPLIT_POLICY = LaunchPolicy(attention="split", rows_target_programs=264)


def gemv_config(n: int, k: int, gated: bool) -> LaunchConfig:
    """The default policy's launch shape for an [n, k] matrix."""
    return DEFAULT_POLICY.gemv_config(n, k, gated)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch needs a Hopper or later GPU."""
    return device.type == "cuda" and _capability(device.index or 0)[0] >= 9


def _use_pdl(device: torch.device, pdl: bool | None) -> bool:
    """Programmatic dependent launch: each kernel is launched while the previous one runs, reads
    the weights (never written) and waits (griddepcontrol.wait) before its first read of anything
    an earlier kernel writes, and before its own writes, so the chain stays in order. None: on
    wherever supported."""
    return pdl_supported(device) if pdl is None else (pdl and pdl_supported(device))


def _launch_options(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


# Buffers the kernels keep between launches, per purpose, device and shape: scratch for partial
# results, and arrival counts that are zero between launches (each launch's last program to
# arrive resets them), so they are allocated, zeroed, once.
KEPT: dict = {}


def kept(key: tuple, make) -> tuple:
    """The buffers kept under `key`, made by `make()` the first time."""
    if key not in KEPT:
        KEPT[key] = make()
    return KEPT[key]


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
def _gemv_batch_kernel(
    x_ptr, w_ptr, norm_ptr, res_ptr, out_ptr,
    M, eps,
    N: tl.constexpr, K: tl.constexpr,
    NORM: tl.constexpr, GATED: tl.constexpr, RESIDUAL: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, EARLY: tl.constexpr, RMS_K: tl.constexpr,
):
    """out[m, n] for every row m < M (M <= ROWS) and BLOCK_N consecutive n, on the CUDA cores.

    `_gemv_kernel` for a few rows at once: the program reads each tile of its weight rows once
    and multiplies it into all the rows, accumulating [ROWS, BLOCK_N, BLOCK_K] products
    elementwise and summing over K at the end, as `_gemv_kernel` does for one row. A batch then
    reads the weights once, with no tensor-core tile of 16 rows to fill. The first weight tile
    is read before waiting on the previous kernel; EARLY loads the residual right after the wait.
    RMS_K > 0 reads the rows' RMS pass in wide tiles (`_rms_scales_wide`) instead of BLOCK_K ones.
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

    Fewer than `policy.rows_min_batch` rows run `_gemv_kernel`, more run `_gemv_rows_kernel`;
    with `policy.batched == "cuda"`, 2 to `policy.cuda_max_rows` rows run `_gemv_batch_kernel`.
    `config` overrides the policy's launch shape.
    """
    M, K = x.shape
    N = weight.shape[0] // 2 if gated else weight.shape[0]
    assert weight.shape[1] == K and x.is_contiguous() and weight.is_contiguous(), (x.shape, weight.shape)
    out = torch.empty(M, N, device=x.device, dtype=out_dtype or x.dtype)
    pdl = _use_pdl(x.device, pdl)
    operands = (x, weight, x if norm is None else norm, x if residual is None else residual, out, M, eps)
    flags = dict(N=N, K=K, NORM=norm is not None, GATED=gated, RESIDUAL=residual is not None, PDL=pdl)
    if policy.batched == "cuda" and 2 <= M <= policy.cuda_max_rows:
        rows = triton.next_power_of_2(M)
        c = config or batch_config(rows, gated)
        _gemv_batch_kernel[(triton.cdiv(N, c.block_n),)](
            *operands, **flags, ROWS=rows, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            EVEN_N=N % c.block_n == 0, EVEN_K=K % c.block_k == 0, EARLY=policy.early_loads,
            RMS_K=rms_columns(rows, K) if policy.wide_rms else 0,
            num_warps=c.num_warps, num_stages=c.num_stages, **_launch_options(pdl),
        )
        return out
    if M < policy.rows_min_batch:
        c = config or policy.gemv_config(N, K, gated)
        _gemv_kernel[(M * triton.cdiv(N, c.block_n),)](
            *operands, **flags, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            EVEN_N=N % c.block_n == 0, EVEN_K=K % c.block_k == 0, EARLY=policy.early_loads,
            num_warps=c.num_warps, num_stages=c.num_stages, **_launch_options(pdl),
        )
        return out
    c = config or policy.rows_gemv
    n_tiles, m_tiles = triton.cdiv(N, c.block_n), triton.cdiv(M, policy.rows_block_m)
    split_k = rows_split_k(n_tiles * m_tiles, triton.cdiv(K, c.block_k), policy.rows_target_programs)
    part, arrivals = (out, out) if split_k == 1 else _split_k_scratch(x.device, n_tiles * m_tiles, split_k,
                                                                      policy.rows_block_m, c.block_n)
    rms_m = min(policy.rows_block_m, triton.next_power_of_2(M)) if policy.wide_rms else 0  # rows a tile can hold
    _gemv_rows_kernel[(n_tiles, split_k, m_tiles)](
        *operands[:5], part, arrivals, *operands[5:], **flags, BLOCK_M=policy.rows_block_m, BLOCK_N=c.block_n,
        BLOCK_K=c.block_k, EVEN_N=N % c.block_n == 0, EVEN_K=K % c.block_k == 0, SPLIT_K=split_k,
        FP32=weight.dtype == torch.float32, PREFETCH=policy.rows_prefetch, RMS_M=rms_m,
        RMS_K=rms_columns(rms_m, K) if rms_m else 0, num_warps=c.num_warps, num_stages=c.num_stages,
        **_launch_options(pdl),
    )
    return out


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
def _attention_decode_kernel(
    qkv_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, out_ptr,
    part_acc_ptr, part_best_ptr, part_total_ptr, arrivals_ptr,
    stride_cm, stride_ch, stride_ct, scale,
    NH: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, BLOCK_T: tl.constexpr,
    RANGE: tl.constexpr, RANGES: tl.constexpr, G_PAD: tl.constexpr, PDL: tl.constexpr, LAST: tl.constexpr,
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
    cos = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
    cache_at = m * stride_cm + kv * stride_ch
    t = t_begin + tl.arange(0, BLOCK_T)
    valid = t < t_end
    at = cache_at + t[:, None] * stride_ct + d[None, :]
    keys = tl.load(k_ptr + at, mask=valid[:, None], other=0.0)
    values = tl.load(v_ptr + at, mask=valid[:, None], other=0.0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the q, k, v of this token come from the previous kernel
    row = qkv_ptr + m * (NH + 2 * KVH) * HD
    q_at = row + h * HD
    q = _rope(tl.load(q_at + d).to(tl.float32), tl.load(q_at + partner).to(tl.float32), cos, sin, d, HALF)
    q = q.to(dtype).to(tl.float32)
    k_at = row + (NH + kv) * HD
    k = _rope(tl.load(k_at + d).to(tl.float32), tl.load(k_at + partner).to(tl.float32), cos, sin, d, HALF).to(dtype)
    v = tl.load(row + (NH + KVH + kv) * HD + d).to(dtype)
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
    t0 = t_begin + BLOCK_T
    while t0 < t_end:  # a while loop: its bound is read on the device (a `range` here breaks the interpreter)
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < t_end
        at = cache_at + t[:, None] * stride_ct + d[None, :]
        keys = tl.load(k_ptr + at, mask=valid[:, None], other=0.0)
        values = tl.load(v_ptr + at, mask=valid[:, None], other=0.0)
        best, total, acc = _attend(keys, values, valid, q, scale, best, total, acc)
        t0 += BLOCK_T
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
    _attention_decode_kernel[(M * num_heads * ranges,)](
        qkv, cos, sin, position, k_cache, v_cache, out, part_acc, part_best, part_total, arrivals,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), hd**-0.5,
        NH=num_heads, KVH=num_kv_heads, HD=hd, BLOCK_T=block_t, RANGE=range_positions, RANGES=ranges, G_PAD=g_pad,
        PDL=pdl, LAST=last, num_warps=4, **_launch_options(pdl),
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


@triton.jit
def _greedy_step_kernel(
    logits_ptr, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr,
    M, out_stride, first_position,
    V: tl.constexpr, H: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, ONE_ROW: tl.constexpr,
):
    """One program per row: argmax, the next token's embedding and the token stored; the last row
    to finish advances the position (and resets the arrival count for the next step), so no row
    reads the position after it has moved. A single row advances it without counting."""
    m = tl.program_id(0)
    pos = tl.load(pos_ptr)
    best = tl.full([BLOCK_V], float("-inf"), dtype=tl.float32)
    best_at = tl.zeros([BLOCK_V], dtype=tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        values = tl.load(logits_ptr + m * V + offs, mask=offs < V, other=float("-inf"))
        better = values > best  # strict: the first of equal maxima wins, as in torch.argmax
        best_at = tl.where(better, offs, best_at)
        best = tl.where(better, values, best)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, best_at, V), axis=0)
    _finish_step(token, m, pos, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr, M, out_stride,
                 first_position, H, BLOCK_H, ONE_ROW)


@triton.jit
def _finish_step(
    token, m, pos, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr, M, out_stride, first_position,
    H: tl.constexpr, BLOCK_H: tl.constexpr, ONE_ROW: tl.constexpr,
):
    """Row m's token stored (tokens, and column pos - first_position + 1 of out), its embedding
    row written to hidden; the last row to finish advances the position (and resets the arrival
    count for the next step), so no row reads the position after it has moved. A single row
    advances it without counting."""
    tl.store(tokens_ptr + m, token.to(tl.int64))
    tl.store(out_ptr + m * out_stride + (pos - first_position + 1), token.to(tl.int64))
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        row = tl.load(embed_ptr + token.to(tl.int64) * H + offs_h, mask=offs_h < H)
        tl.store(hidden_ptr + m * H + offs_h, row, mask=offs_h < H)
    if ONE_ROW:
        tl.store(pos_ptr, pos + 1)
    else:
        tl.debug_barrier()  # the position is read before this row counts itself
        if tl.atomic_add(arrivals_ptr, 1, sem="acq_rel") == M - 1:
            tl.store(pos_ptr, pos + 1)
            tl.atomic_xchg(arrivals_ptr, 0)


@triton.jit
def _order_key(x):
    """float32 -> int32 in the same order: the IEEE bits, with the negative half's order reversed."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _sample_step_kernel(
    logits_ptr, uniform_ptr, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr,
    M, out_stride, first_position, temperature, top_p, top_k,
    V: tl.constexpr, H: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    TEMPERATURE: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, ONE_ROW: tl.constexpr,
):
    """One program per row, the row held in registers: temperature, top-k, top-p and the
    exponential race `argmax(p / -log u)`, as `inferlab.fast.engine.pick` does with a sort.

    Top-k keeps every logit >= the k-th largest; top-p every token whose weight e = exp(x - max)
    is >= the smallest weight w with sum(e <= w) > (1 - p) sum(e). Each threshold is found by
    bisection over order keys (the logits' IEEE bits, the negative half reversed; the weights'
    bits as they are, since weights are >= 0), at most 32 halvings, so it is a value of the row,
    exactly, without a sort. Only one array of the row is live at a time (the logits, then the
    weights; the uniform draws at the end)."""
    m = tl.program_id(0)
    pos = tl.load(pos_ptr)
    offs = tl.arange(0, BLOCK_V)
    valid = offs < V
    x = tl.load(logits_ptr + m * V + offs, mask=valid, other=float("-inf"))
    if TEMPERATURE:
        x = tl.math.div_rn(x, temperature)
    if TOP_K:
        lo = tl.min(tl.where(valid, _order_key(x), 2147483647), axis=0)
        hi = tl.max(_order_key(x), axis=0)
        while lo < hi:  # the largest key with at least top_k keys at or above it: the k-th largest
            mid = (lo >> 1) + (hi >> 1) + ((lo | hi) & 1)  # ceil((lo + hi) / 2), without overflow
            enough = tl.sum(tl.where(valid & (_order_key(x) >= mid), 1, 0), axis=0) >= top_k
            lo = tl.where(enough, mid, lo)
            hi = tl.where(enough, hi, mid - 1)
        x = tl.where(_order_key(x) >= lo, x, float("-inf"))
    e = tl.exp(x - tl.max(x, axis=0))  # 0 for the tokens removed, and past the vocabulary
    total = tl.sum(e, axis=0)
    if TOP_P:
        below = (1.0 - top_p) * total
        lo = tl.zeros((), dtype=tl.int32)
        hi = tl.max(e.to(tl.int32, bitcast=True), axis=0)
        while lo < hi:  # the smallest weight whose mass at or below it exceeds 1 - p
            mid = (lo + hi) >> 1  # both below 2^30: weights are at most 1.0
            over = tl.sum(tl.where(e.to(tl.int32, bitcast=True) <= mid, e, 0.0), axis=0) > below
            hi = tl.where(over, mid, hi)
            lo = tl.where(over, lo, mid + 1)
        e = tl.where(e.to(tl.int32, bitcast=True) >= lo, e, 0.0)
        total = tl.sum(e, axis=0)
    p = tl.math.div_rn(e, total)  # the kept tokens' probabilities; 0 for the others
    u = tl.load(uniform_ptr + m * V + offs, mask=valid, other=0.5)
    race = tl.where(p > 0.0, tl.math.div_rn(p, -tl.log(tl.maximum(u, 1e-20))), -1.0)
    token = tl.argmax(race, axis=0, tie_break_left=True)  # the first of equal maxima, as torch.argmax
    _finish_step(token, m, pos, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr, M, out_stride,
                 first_position, H, BLOCK_H, ONE_ROW)


def greedy_step(
    logits: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    position: torch.Tensor,
    first_position: int,
) -> None:
    """Same contract as `inferlab.fast.spec.greedy_step`, in one kernel of one program per row.

    Launched without programmatic dependent launch: it starts after everything before it has
    finished, and the next step's kernels start after it has, the full dependency that
    `attention_decode` relies on.
    """
    M, V = logits.shape
    H = embed.shape[1]
    assert logits.is_contiguous() and embed.is_contiguous() and hidden.is_contiguous() and out.stride(1) == 1
    arrivals, = kept(("greedy", logits.device), lambda: (torch.zeros(1, device=logits.device, dtype=torch.int32),))
    _greedy_step_kernel[(M,)](
        logits, embed, hidden, tokens, out, position, arrivals, M, out.stride(0),
        first_position, V=V, H=H, BLOCK_V=GREEDY_BLOCK_V, BLOCK_H=1024, ONE_ROW=M == 1, num_warps=GREEDY_WARPS,
    )


# the sampling kernel holds a row of logits in registers, at most 32 a thread at 1024 threads:
# TinyLlama's and Llama-2's 32,000 fit; SmolLM2's 49,152 would spill inside the bisection loops
# (`inferlab.fast.aot`) and stays with the torch step, as larger vocabularies do
SAMPLE_MAX_VOCAB = 32768


def sample_kernel_fits(vocab: int) -> bool:
    return vocab <= SAMPLE_MAX_VOCAB


def sample_warps(block: int) -> int:
    """Warps of the sampling kernel's one program for a row padded to `block`: 32 logits a thread
    up to 1024 threads."""
    return min(32, max(4, block // 1024))


def sample_step(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    uniform: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    position: torch.Tensor,
    first_position: int,
) -> None:
    """The end of a sampled decode step in one kernel, one program per row: the token that
    `inferlab.fast.engine.pick` draws from logits [M, V] (float32) with uniform [M, V] (temperature,
    top-k, top-p, then argmax(p / -log u)), then what `greedy_step` does with its token.

    Exact up to float rounding: a logit whose mass at or below it lies within rounding of 1 - p,
    or two race values within an ulp, may go the other way than in the sorted torch step."""
    M, V = logits.shape
    H = embed.shape[1]
    if not sample_kernel_fits(V):
        raise ValueError(f"the sampling kernel holds at most {SAMPLE_MAX_VOCAB} logits a row, not {V}")
    assert logits.dtype == torch.float32 and uniform.shape == logits.shape and uniform.dtype == torch.float32
    assert logits.is_contiguous() and uniform.is_contiguous() and embed.is_contiguous() and hidden.is_contiguous()
    assert out.stride(1) == 1
    top_k = min(sampling.top_k, V) if sampling.top_k is not None else 0
    top_p = float(sampling.top_p) if sampling.top_p is not None and sampling.top_p < 1.0 else 1.0
    block = triton.next_power_of_2(V)
    arrivals, = kept(("sample", logits.device), lambda: (torch.zeros(1, device=logits.device, dtype=torch.int32),))
    _sample_step_kernel[(M,)](
        logits, uniform, embed, hidden, tokens, out, position, arrivals, M, out.stride(0), first_position,
        float(sampling.temperature), top_p, top_k,
        V=V, H=H, BLOCK_V=block, BLOCK_H=1024, TEMPERATURE=sampling.temperature != 1.0, TOP_K=top_k > 0,
        TOP_P=top_p < 1.0, ONE_ROW=M == 1, num_warps=sample_warps(block),
    )


@dataclass(frozen=True)
class Kernels:
    """These kernels with one launch mode and launch policy, usable wherever `inferlab.fast.spec` is."""

    pdl: bool | None = None
    policy: LaunchPolicy = DEFAULT_POLICY

    def gemv(self, *args, **kwargs) -> torch.Tensor:
        return gemv(*args, pdl=self.pdl, policy=self.policy, **kwargs)

    def attention_decode(self, qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads) -> torch.Tensor:
        operands = (qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
        policy = self.policy
        if policy.attention_for(k_cache.shape[2]) == "split":
            splits = attention_splits(k_cache.shape[2], policy.split_positions, policy.max_splits)
            return attention_decode_split(*operands, block_t=policy.split_block_t, splits=splits, pdl=self.pdl,
                                          combine=policy.split_combine)
        return attention_decode(*operands, block_t=policy.head_block_t, pdl=self.pdl,
                                range_positions=policy.head_range_for(k_cache.shape[2]), combine=policy.head_combine)

    def greedy_step(self, *args, **kwargs) -> None:
        greedy_step(*args, **kwargs)

    def sample_step(self, *args, **kwargs) -> None:
        sample_step(*args, **kwargs)
