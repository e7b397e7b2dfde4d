"""Which kernel each call runs and with which launch shape: `LaunchPolicy`, passed to the kernels,
never patched in; and the launch shapes measured per matrix.

Plain data, no kernel code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


DEFAULT_GEMV = LaunchConfig(block_n=8, block_k=256, num_warps=4, num_stages=3)
# (N, K, gated) -> config: the TinyLlama-1.1B matrices, measured on an H200 (docs/perf/h200/kernels.md).
TINYLLAMA_GEMV: dict[tuple[int, int, bool], LaunchConfig] = {
    (2560, 2048, False): LaunchConfig(2, 1024, 4, 1),  # [q; k; v]
    (2048, 2048, False): LaunchConfig(2, 1024, 4, 1),  # o
    (5632, 2048, True): LaunchConfig(4, 2048, 4, 3),  # [gate; up]
    (2048, 5632, False): LaunchConfig(4, 2048, 4, 1),  # down
    (32000, 2048, False): LaunchConfig(4, 1024, 4, 3),  # lm head
}
# SmolLM2-135M's (`kernel_configs.py --model smollm2-135m --early-loads` on an H200): narrow
# matrices want few rows a program (more programs than SMs) and all of K in one tile; 2.8-3.9 us
# each in the default shape, 1.4-2.4 us in these
SMOLLM2_GEMV: dict[tuple[int, int, bool], LaunchConfig] = {
    (960, 576, False): LaunchConfig(2, 1024, 8, 3),  # [q; k; v]
    (576, 576, False): LaunchConfig(1, 1024, 4, 1),  # o
    (1536, 576, True): LaunchConfig(2, 1024, 4, 1),  # [gate; up]
    (576, 1536, False): LaunchConfig(1, 2048, 8, 3),  # down
    (49152, 576, False): LaunchConfig(16, 256, 4, 3),  # lm head
}
MEASURED_GEMV: dict[tuple[int, int, bool], LaunchConfig] = {**TINYLLAMA_GEMV, **SMOLLM2_GEMV}
ATTENTION_BLOCK_T = 128
# The split attention (`attention_decode_split`): positions per tile, and about one range of the
# context per SPLIT_POSITIONS cached positions, at most MAX_SPLITS ranges.
SPLIT_BLOCK_T, SPLIT_POSITIONS, MAX_SPLITS = 16, 32, 64
GREEDY_BLOCK_V, GREEDY_WARPS = 8192, 16
# top-p in the sampling kernel of one program a row: the race's first winners over the whole row
# checked for the nucleus, in race order, before its threshold is searched by bisection; each is
# outside the nucleus with a chance of at most 1 - p
SAMPLE_CANDIDATES = 4


ATTENTION_KERNELS = {"head": "attention_decode", "split": "attention_decode_split"}
SPLIT_COMBINES = ("last", "kernel")

ROWS_GEMV = LaunchConfig(block_n=32, block_k=256, num_warps=4, num_stages=4)  # measured at batch 4 on the H200
# the stream-K kernel's unit: 64 weight rows (Hopper's warpgroup product) x 128 columns, 4 stages
STREAM_GEMV = LaunchConfig(block_n=64, block_k=128, num_warps=4, num_stages=4)
STREAM_PER_SM = 2
# the TMA kernel's tile: 64 weight rows x 256 columns copied by the tensor memory accelerator, 3
# stages; K split until about TMA_PER_SM programs per SM (the fastest for [gate; up], [q; k; v] and
# o alone at 4 and 16 rows on the H200, docs/perf/h200/tma.md)
TMA_GEMV = LaunchConfig(block_n=64, block_k=256, num_warps=4, num_stages=3)
TMA_PER_SM = 1
# the LM head in tiles of 128 weight rows x 128 (34.3 against 37.3 us alone at 4 rows)
TMA_HEAD = LaunchConfig(block_n=128, block_k=128, num_warps=4, num_stages=3)
BATCHED_KERNELS = ("row", "cuda", "rowwise", "tensor", "stream", "tma")
SAMPLING_KERNELS = ("torch", "kernel", "split")


@dataclass(frozen=True)
class RowsLaunch:
    """How one matrix is multiplied into a batch: `kernel` "row" (`_gemv_kernel`, one program per
    row and weight block), "cuda" (`_gemv_batch_kernel`, each weight block into every row on the
    CUDA cores, up to `LaunchPolicy.cuda_max_rows` rows), "rowwise" (the same kernel one row at a
    time, up to `LaunchPolicy.rowwise_max_rows` rows), "tensor" (`_gemv_rows_kernel`) or "stream"
    (`_gemv_stream_kernel`, the work spread evenly over a fixed number of programs) or "tma"
    (`_gemv_tma_kernel`, the weight tiles copied by the tensor memory accelerator); its launch
    shape (None: the policy's for that kernel: for "rowwise", the one-row kernel's); for "tensor",
    the split-K target (programs, 0: no split) and whether the first weight tile is loaded before
    the wait; for "stream", its programs (0: the policy's `stream_per_sm` per SM) and whether the
    first unit's weights are loaded before the wait; for "tma", the split-K target (0: the
    policy's `tma_per_sm` per SM) and `l2_tiles`, the weight tiles each program asks L2 for
    before the wait (at least the policy's `tma_prefetch`)."""

    kernel: str = "tensor"
    config: LaunchConfig | None = None
    target_programs: int = 0
    prefetch: bool = False
    l2_tiles: int = 0

    def __post_init__(self) -> None:
        if self.kernel not in BATCHED_KERNELS:
            raise ValueError(f"RowsLaunch kernel must be one of {list(BATCHED_KERNELS)}, not {self.kernel!r}")
        if self.l2_tiles < 0:
            raise ValueError(f"RowsLaunch l2_tiles must be 0 or more weight tiles, not {self.l2_tiles}")


# (N, K, gated, rows) -> launch, for `LaunchPolicy(batched="tensor", rows=TENSOR_ROWS)`, the
# batched step before the TMA kernel: TinyLlama-1.1B's matrices at 4 rows where another kernel than the
# tensor-core one was the fastest alone (`kernel_configs.py --probe-rows 4,16` on an H200) and the
# step with them was faster: TPOT 1.207 against 1.250 ms at batch 4 (docs/perf/h200/targets-2.md).
# Narrow matrices leave SMs idle with one tile of 32 rows a program: [q; k; v] and o run on the
# CUDA cores in the one-row kernel's long tiles (9.2 and 5.9 against 10.9 and 8.5 us alone), down
# split over K (10.5 against 14.5 us). At 16 rows the kernels alone differed as much, the step not
# (1.422 ms with such launches in one run, 1.419 without in the run before): none are kept there.
# At 8 rows (`--probe-rows 8,4,16` on an H100): down split over K (11.99 against 14.67 us), o in
# tiles of 16 weight rows split over K (6.79 against 8.56), [q; k; v] with its first tile loaded
# before the wait (10.86 against 11.16); the batch-8 step 1.413 against 1.435 ms in one run, where
# the same launches at 16 rows left the batch-16 step at 1.510 ms (docs/perf/h100/targets-3.md).
TENSOR_ROWS: dict[tuple[int, int, bool, int], RowsLaunch] = {
    (2560, 2048, False, 4): RowsLaunch("cuda", LaunchConfig(2, 1024, 4, 1)),
    (2048, 2048, False, 4): RowsLaunch("cuda", LaunchConfig(2, 1024, 4, 1)),
    (2048, 5632, False, 4): RowsLaunch("tensor", target_programs=264),
    (2560, 2048, False, 8): RowsLaunch("tensor", prefetch=True),
    (2048, 2048, False, 8): RowsLaunch("tensor", LaunchConfig(16, 256, 4, 4), target_programs=264),
    (2048, 5632, False, 8): RowsLaunch("tensor", target_programs=264),
}
# (N, K, gated, rows) -> launch, the default table: TinyLlama-1.1B's LM head in the TMA kernel's
# tiles of 128 weight rows (alone on the H200, 34.3 against 37.3 us at 4 rows, 38.6 against 49.0
# at 16; the step at batch 16 1.207 against 1.221 ms: docs/perf/h200/tma.md)
# and at 4 rows o one row at a time in the one-row kernel's tile as wide as K, its weight loaded
# before waiting on the attention: the batch-4 step 2.1-2.5% faster on an H100 in three runs, 4.5%
# slower at 8 rows (docs/perf/h100/attention-o.md);
# and [gate; up]'s programs asking L2 for their first 4 weight tiles (of 8) before the wait: on an
# H100 the step 3.2% / 2.3% / 1.2% faster at batches 4 / 8 / 16 than without, where 1 or 2 tiles
# gained less and 8 tiles lost 0.5% at batch 4 (docs/perf/h100/gate-up-l2.md);
# and [q; k; v], o (from 8 rows: at 4 it runs one row at a time) and down asking L2 for their
# first weight tile before the wait: on an H100 the step 3.1% / 4.6% / 3.6% faster at batches
# 4 / 8 / 16 than without, the same to 0.1% in three processes, where [q; k; v] and o alone gained
# 1.6-1.8% / 3.3% / 2.5-2.7% and down alone 1.2% / 1.2% / 0.6%, and the LM head's request nothing
# (docs/perf/h100/l2-one-tile.md)
L2_ONE_TILE = ((2560, 2048, False, (4, 8, 16)), (2048, 2048, False, (8, 16)), (2048, 5632, False, (4, 8, 16)))
MEASURED_ROWS: dict[tuple[int, int, bool, int], RowsLaunch] = {
    **{(32000, 2048, False, rows): RowsLaunch("tma", TMA_HEAD) for rows in (4, 8, 16)},
    (2048, 2048, False, 4): RowsLaunch("rowwise", LaunchConfig(2, 2048, 4, 1)),
    **{(5632, 2048, True, rows): RowsLaunch("tma", l2_tiles=4) for rows in (4, 8, 16)},
    **{(n, k, gated, rows): RowsLaunch("tma", l2_tiles=1) for n, k, gated, sizes in L2_ONE_TILE for rows in sizes},
}


@dataclass(frozen=True)
class LaunchPolicy:
    """Which GEMV kernel each call runs and with which launch shape: passed to the kernels, never patched in.

    Fewer than `rows_min_batch` rows run one program per output tile per row, with the shape
    `gemv[(n, k, gated)]` (else `default_gemv`); more rows run the tensor-core kernel, which reads
    each weight tile once for `rows_block_m` rows, with `rows_gemv`. From `rows_min_batch` rows, a
    matrix measured at that many rows (`rows`, keyed by (n, k, gated, rows rounded up to a power
    of two, at most `rows_block_m`)) runs the kernel and launch measured fastest there; below
    it, only an entry of exactly that many rows applies (a launch measured at 1 row, say).
    """

    gemv: Mapping[tuple[int, int, bool], LaunchConfig] = field(default_factory=lambda: MappingProxyType(MEASURED_GEMV))
    default_gemv: LaunchConfig = DEFAULT_GEMV
    rows_min_batch: int = 4
    # "tensor": from rows_min_batch rows, the tensor-core kernel; "cuda": from 2 rows up to
    # cuda_max_rows, one program per weight block multiplies it into every row on the CUDA cores;
    # "rowwise": from 2 rows up to rowwise_max_rows, the same one row at a time, summing each tile
    # over K at once, in the one-row kernel's launch shape (its long tiles fit: one row's products
    # in registers, not all rows'). Built for batches whose projections reach 40-55% of bandwidth
    # in the tensor-core kernel against ~75% at one row; measured, it loses: on an H100 TPOT 1.457
    # against 1.318 ms at batch 4, 2.660 against 1.435 at batch 8 (docs/perf/h100/targets-3.md).
    # "tma" (the default): from rows_min_batch rows, `_gemv_tma_kernel`, the tensor-core products
    # with the weight tiles copied by the TMA and K split to fill the GPU; on the H200 TPOT 0.941 /
    # 1.031 / 1.207 ms at batches 4 / 8 / 16 against 1.207 / 1.296 / 1.434 for "tensor" with
    # `TENSOR_ROWS` (docs/perf/h200/tma.md). Where a weight cannot have a TMA descriptor (a GPU
    # before Hopper, rows not 16-byte aligned) the tensor-core kernel runs instead.
    batched: str = "tma"
    # batched "stream": from rows_min_batch rows, `_gemv_stream_kernel` in this launch shape, with
    # this many programs per SM (each matrix's work cut evenly between them, whatever its shape)
    stream_gemv: LaunchConfig = STREAM_GEMV
    stream_per_sm: int = STREAM_PER_SM
    stream_prefetch: bool = False
    # the stream-K kernel's weight tiles copied by the TMA (where a descriptor can be made), as the
    # TMA kernel reads them: its even cut of the work with the TMA kernel's loads
    stream_tma: bool = False
    # batched "tma": from rows_min_batch rows, `_gemv_tma_kernel` in this launch shape, K split
    # until about this many programs per SM
    tma_gemv: LaunchConfig = TMA_GEMV
    tma_per_sm: int = TMA_PER_SM
    # batched "tma": each program asks L2 for its first this many weight tiles before waiting on
    # the previous kernel (0: none), as the one-row kernel loads its first tile there; a matrix's
    # own launch may ask for more (`RowsLaunch.l2_tiles`: [gate; up]'s 4 in `MEASURED_ROWS`)
    tma_prefetch: int = 0
    # batched "tma": each program's first weight tile copied into shared memory before the wait
    # (32 KB more a program in 64 x 256 tiles, 64 KB for [gate; up])
    tma_early: bool = False
    # batched "tma": the RMS pass over the rows issues every tile's load before its first reduction
    # (`_rms_scales_wide(AT_ONCE=True)`): one round trip where the loop takes one a tile of
    # 8,192 values (2 at 8 rows, 4 at 16 for K = 2048; 1 at 4 rows, the same code there). On an
    # H100 TPOT −2.3% at batch 8, −5.7% at batch 16 (docs/perf/h100/rms-at-once.md); False: the
    # loop, one tile's loads after the reduction of the tile before (`fast_targets.py` cases
    # `fast bN rms in tiles`)
    rms_at_once: bool = True
    cuda_max_rows: int = 8
    # 8: at 16 rows down's kernel in its one-row shape (4 x 2048) spills (`inferlab.fast.aot`)
    rowwise_max_rows: int = 8
    rows_gemv: LaunchConfig = ROWS_GEMV
    rows_block_m: int = 16
    rows: Mapping[tuple[int, int, bool, int], RowsLaunch] = field(
        default_factory=lambda: MappingProxyType(MEASURED_ROWS))
    # the tensor-core kernel cuts K into ranges until its programs number about this many (0: never)
    rows_target_programs: int = 0
    # the tensor-core kernel loads its first weight tile before waiting on the previous kernel
    # (as the one-row kernel does); for the whole step, mixed on the H200: -2.0% at batch 4, -5.1%
    # at 8, +9.4% at 16 (docs/perf/h200/targets-2.md)
    rows_prefetch: bool = False
    # the batched kernels' RMS pass over their rows in wide tiles summed as they go
    # (`_rms_scales_wide`: 4 rows x 2048 columns in one load) instead of the products' K tiles
    # (16 rows x 256 columns, eight loads one after another for K = 2048). On the H200 +0.7%, +8.4%
    # and +4.7% at batches 4, 8 and 16 (docs/perf/h200/targets-2.md)
    wide_rms: bool = False
    # the one-row and CUDA-core projection kernels issue every load that does not wait on a
    # reduction at once (the residual beside the input; in the one-row kernel where K fits one
    # tile, also the norm weight before the wait and the input read once for its norm and its
    # products): one or two round trips to memory fewer per kernel (the kernels' EARLY). Not the
    # tensor-core kernel: a residual tile held across its loop spills. TPOT against without: on the
    # H200 TinyLlama b1 0.666 against 0.681 ms (two runs); on an H100 TinyLlama b1 0.817 against
    # 0.826 ms, SmolLM2 in its own launch shapes 0.334 against 0.359 ms (docs/perf/h100/targets-3.md)
    early_loads: bool = True
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
    # warps a program of the per-head kernel: 8 with head_block_t = head_range = 256 holds a whole
    # 256-position cache (K and V, 64 KB at head size 64) in one tile, read before the wait, with
    # no combine kernel
    head_warps: int = 4
    # > 0: at up to `head_whole_rows` rows, a cache of at most this many positions is read by one
    # program a head in a single tile (the cache's length, rounded up to a power of two: its keys
    # and values loaded before the wait) of `head_whole_warps` warps, with no ranges and no combine
    # kernel; a longer cache, or more rows, run in ranges of `head_range`. On an H100, 256 (8 warps)
    # decoded prompt 128 + 128 new tokens 2.4-3.0% faster at batch 1 (three runs) and 2.8% at
    # batch 4 (two) than 2 ranges of 128 and a combine kernel, and 5.0% slower at batch 16
    # (docs/perf/h100/l2-ahead.md, attention-o.md). 0: off.
    head_whole_cache: int = 256
    head_whole_rows: int = 4
    head_whole_warps: int = 8
    # > 0: at up to `attention_o_rows` rows, over a cache of at most this many positions, a layer's
    # attention and o projection run as one kernel (`attention_o`): one program per query head and
    # block of `attention_o_block_n` of o's output rows, of `attention_o_warps` warps, o's weight
    # slice and the cache's first `attention_o_block_t` positions (at most: the cache's length
    # rounded up to a power of two) loaded before the wait, the heads' partial sums added by the
    # last to arrive. A layer is then four kernels. 0: off. `attention_o_registers` > 0 caps a
    # thread's registers (ptxas spills the rest), so that more programs share an SM.
    attention_o_cache: int = 0
    attention_o_rows: int = 1
    attention_o_block_n: int = 256
    attention_o_block_t: int = 256
    attention_o_warps: int = 8
    attention_o_registers: int = 0
    # > 0: at up to `qkv_attention_rows` rows (where the one-row projection runs), over a cache of
    # at most this many positions, a layer's [q; k; v] projection and attention run as one launch
    # (`qkv_attention`): the projection's programs, then one attention program per query head that
    # waits on its KV head's rows instead of the projection's end, loading its first
    # `qkv_attention_block_t` cached positions before. A layer is then four kernels. 0: off.
    # `qkv_attention_registers` > 0 caps a thread's registers (ptxas spills the rest): the
    # attention's tiles would otherwise set the whole launch's registers, and fewer of the
    # projection's programs would fit on an SM at once than in its own kernel (48 registers).
    qkv_attention_cache: int = 0
    qkv_attention_rows: int = 1
    qkv_attention_block_t: int = 32
    qkv_attention_registers: int = 0
    # who merges the per-head kernel's ranges: "kernel", `_attention_combine_kernel` after it (one
    # kernel more a layer); "last", the last of each head's ranges to finish, in the same kernel
    # (an atomic count a program instead of a kernel boundary). On the H200 "last" loses: +1.4% at
    # batch 1 on TinyLlama, +3.5% on SmolLM2 (docs/perf/h200/targets-2.md)
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
    # "kernel", `sample_step`, one program a row that finds the thresholds by bisection
    # (vocabularies up to SAMPLE_MAX_VOCAB): on the H200, TPOT 0.739 against 0.768 ms with
    # temperature 0.7 and top-p 0.9 (docs/perf/h200/targets-2.md), bound by its one SM; with
    # top-p by candidates (`sample_candidates`) 1.029x greedy on an H100 (h100/targets-5.md);
    # "split", `sample_step_split`, one program per 1024 logits of a row, the thresholds by radix
    # selection over grid barriers, any vocabulary while every program of the launch fits on the
    # GPU at once (`split_fits`; else the torch step). On an H100 "split" loses: TPOT 0.979
    # against 0.877 ms for "kernel" (docs/perf/h100/targets-4.md)
    sampling: str = "kernel"
    # "kernel" with top-p: how many of the race's winners over the whole row are checked for the
    # nucleus (one sum each) before its threshold is searched by bisection (up to 32 sums); 0
    # searches it at once, as the kernel did before. On an H100 at top-p 0.9 the kernel alone
    # takes 21.8 us with 4 against 58.3 us with 0, and 111 us when all 4 are outside
    # (docs/perf/h100/targets-5.md)
    sample_candidates: int = SAMPLE_CANDIDATES
    # at batch 1, every layer in one persistent kernel (`decode_layers`): about one program per
    # SM (`persistent_per_sm`) alive for the whole step, its phases separated by grid barriers
    # instead of kernel boundaries, so a step is three kernels (layers, LM head, greedy step)
    # instead of five or six a layer. Built for the launch-bound small models; on the H200 it loses:
    # TPOT 1.94 against 0.68 ms on TinyLlama, 0.593 against 0.504 on SmolLM2 (targets-2.md).
    # Its weights are stacked per kind ([L, ...]): o and down are then held twice (model and stack).
    persistent: bool = False
    persistent_per_sm: int = 1
    # > 0: while a kernel runs it asks L2 for the first this many bytes of the weight the next
    # kernel reads (`inferlab.fast.kernels.ahead`): the attention kernel for o's weight before its
    # wait, the one-row and TMA projections for the next matrix's once their own tiles are in, the
    # LM head for the first layer's [q; k; v], so that the memory bus does not idle across kernel
    # boundaries and under the attention. 0: off.
    l2_ahead: int = 0
    # who asks with l2_ahead > 0: "all" (as above) or "attention" (the attention kernel only)
    l2_ahead_from: str = "all"

    def __post_init__(self) -> None:
        if self.batched not in ("tensor", "cuda", "rowwise", "stream", "tma"):
            raise ValueError(f"batched must be 'tensor', 'cuda', 'rowwise', 'stream' or 'tma', not {self.batched!r}")
        if self.stream_per_sm < 1:
            raise ValueError(f"stream_per_sm must be at least 1, not {self.stream_per_sm}")
        if self.tma_per_sm < 1:
            raise ValueError(f"tma_per_sm must be at least 1, not {self.tma_per_sm}")
        if self.tma_prefetch < 0:
            raise ValueError(f"tma_prefetch must be 0 or more, not {self.tma_prefetch}")
        if self.split_combine not in SPLIT_COMBINES:
            raise ValueError(f"split_combine must be one of {list(SPLIT_COMBINES)}, not {self.split_combine!r}")
        if self.head_combine not in SPLIT_COMBINES:
            raise ValueError(f"head_combine must be one of {list(SPLIT_COMBINES)}, not {self.head_combine!r}")
        if self.head_range < 0 or self.head_range % self.head_block_t:
            raise ValueError(f"head_range must be 0 or a multiple of head_block_t ({self.head_block_t}), "
                             f"not {self.head_range}")
        if self.sampling not in SAMPLING_KERNELS:
            raise ValueError(f"sampling must be one of {list(SAMPLING_KERNELS)}, not {self.sampling!r}")
        if self.sample_candidates < 0:
            raise ValueError(f"sample_candidates must be 0 or more, not {self.sample_candidates}")
        if self.head_whole_rows < 1:
            raise ValueError(f"head_whole_rows must be 1 or more, not {self.head_whole_rows}")
        if self.head_whole_cache < 0:
            raise ValueError(f"head_whole_cache must be 0 or more positions, not {self.head_whole_cache}")
        if self.attention_o_cache < 0:
            raise ValueError(f"attention_o_cache must be 0 or more positions, not {self.attention_o_cache}")
        if self.attention_o_rows < 1:
            raise ValueError(f"attention_o_rows must be 1 or more, not {self.attention_o_rows}")
        if self.attention_o_registers < 0:
            raise ValueError(f"attention_o_registers must be 0 (the compiler's choice) or more, not "
                             f"{self.attention_o_registers}")
        if self.qkv_attention_cache < 0:
            raise ValueError(f"qkv_attention_cache must be 0 or more positions, not {self.qkv_attention_cache}")
        if self.qkv_attention_registers < 0:
            raise ValueError(f"qkv_attention_registers must be 0 (the compiler's choice) or more, not "
                             f"{self.qkv_attention_registers}")
        if self.qkv_attention_rows < 1:
            raise ValueError(f"qkv_attention_rows must be 1 or more, not {self.qkv_attention_rows}")
        for name in ("head_warps", "head_whole_warps", "attention_o_block_n", "attention_o_block_t",
                     "attention_o_warps", "qkv_attention_block_t"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, not {value}")
        if self.l2_ahead < 0:
            raise ValueError(f"l2_ahead must be 0 or more bytes, not {self.l2_ahead}")
        if self.l2_ahead_from not in ("all", "attention"):
            raise ValueError(f"l2_ahead_from must be 'all' or 'attention', not {self.l2_ahead_from!r}")
        if self.persistent_per_sm < 1:
            raise ValueError(f"persistent_per_sm must be at least 1, not {self.persistent_per_sm}")
        if self.attention not in (*ATTENTION_KERNELS, "auto"):
            raise ValueError(f"attention must be one of {sorted((*ATTENTION_KERNELS, 'auto'))}, not {self.attention!r}")

    def attention_for(self, cache_length: int) -> str:
        """"head" or "split": the attention this policy runs over a cache of `cache_length` positions."""
        if self.attention == "auto":
            return "split" if cache_length >= self.split_min_cache else "head"
        return self.attention

    def attention_kernel(self, cache_length: int) -> str:
        """The name of the function in `inferlab.fast.kernels` that the policy's attention runs for that cache."""
        return ATTENTION_KERNELS[self.attention_for(cache_length)]

    def head_whole_for(self, cache_length: int, rows: int = 1) -> bool:
        """Whether the per-head kernel reads a cache of `cache_length` positions at `rows` rows in
        one tile (`head_whole_cache`, `head_whole_rows`)."""
        return cache_length <= self.head_whole_cache and rows <= self.head_whole_rows

    def head_range_for(self, cache_length: int, rows: int = 1) -> int:
        """Positions per range of the per-head kernel over a cache of `cache_length` positions at
        `rows` rows: 0 (no ranges, no combine kernel) where the cache holds no more than one range,
        or is read whole (`head_whole_for`)."""
        if self.head_whole_for(cache_length, rows):
            return 0
        return self.head_range if self.head_range and cache_length > self.head_range else 0

    def head_launch_for(self, cache_length: int, rows: int = 1) -> tuple[int, int, int]:
        """(positions a tile, positions a range or 0, warps a program) of the per-head kernel over a
        cache of `cache_length` positions at `rows` rows."""
        if self.head_whole_for(cache_length, rows):
            return 1 << max(cache_length - 1, 0).bit_length(), 0, self.head_whole_warps
        return self.head_block_t, self.head_range_for(cache_length, rows), self.head_warps

    def attention_o_for(self, cache_length: int, rows: int) -> bool:
        """Whether a layer's attention and o projection run as one kernel over a cache of
        `cache_length` positions at `rows` rows."""
        return cache_length <= self.attention_o_cache and rows <= self.attention_o_rows

    def qkv_attention_launch(self, n: int, k: int, rows: int, cache_length: int, num_heads: int, num_kv_heads: int,
                             head_dim: int) -> LaunchConfig | None:
        """The projection's launch shape where a layer's [q; k; v] projection ([n, k]) and attention
        run as one launch at `rows` rows over a cache of `cache_length` positions, else None: within
        `qkv_attention_cache` and `qkv_attention_rows`, where the one-row projection runs and its
        rows a program divide the head size (each program's rows in one head)."""
        if cache_length > self.qkv_attention_cache or rows > self.qkv_attention_rows:
            return None
        launch = self.rows_launch(n, k, False, rows)
        config = launch.config or self.gemv_config(n, k, False)
        if launch.kernel != "row" or n != (num_heads + 2 * num_kv_heads) * head_dim or head_dim % config.block_n:
            return None
        return config

    def decode_kernels(self, layers: int, cache_length: int, batch: int = 1) -> int:
        """Kernels in one greedy decode step over a cache of `cache_length` positions: per layer
        the four projections and the attention, plus a combine kernel where one merges the
        attention's ranges; then the LM head and the greedy step kernel. With `persistent` at
        batch 1, one kernel for all the layers instead; with the attention and o in one kernel
        (`attention_o_for`), or the [q; k; v] projection and the attention (`qkv_attention_cache`,
        where the model's shapes allow: `qkv_attention_launch`), four a layer."""
        if self.persistent and batch == 1:
            return 3
        if self.attention_o_for(cache_length, batch) or (
                cache_length <= self.qkv_attention_cache and batch <= self.qkv_attention_rows):
            return layers * 4 + 2
        if self.attention_for(cache_length) == "split":
            combine = self.split_combine == "kernel"
        else:
            combine = bool(self.head_range_for(cache_length, batch)) and self.head_combine == "kernel"
        return layers * (5 + combine) + 2

    def gemv_config(self, n: int, k: int, gated: bool) -> LaunchConfig:
        """The launch shape for an [n, k] matrix (n rows per half when gated) at few rows."""
        return self.gemv.get((n, k, gated), self.default_gemv)

    def rows_key(self, n: int, k: int, gated: bool, rows: int) -> tuple[int, int, bool, int]:
        """The key of `rows` for an [n, k] matrix at that many rows: rows rounded up to a power of
        two, at most `rows_block_m` (the tensor-core kernel's tile; more rows are more tiles)."""
        return n, k, gated, min(1 << (rows - 1).bit_length(), self.rows_block_m)

    def max_rows(self, kernel: str) -> int:
        """The most rows `kernel` (one of BATCHED_KERNELS) takes in one launch: the CUDA-core
        kernels unroll their rows (`cuda_max_rows`, `rowwise_max_rows`); the others take any."""
        return {"cuda": self.cuda_max_rows, "rowwise": self.rowwise_max_rows}.get(kernel, 1 << 62)

    def rows_launch(self, n: int, k: int, gated: bool, rows: int) -> RowsLaunch:
        """The kernel and launch shape that multiply an [n, k] matrix into `rows` rows: the measured
        one (`rows`) where there is one (below `rows_min_batch`, one measured at exactly that many
        rows), else the policy's own choice by row count."""
        key = self.rows_key(n, k, gated, rows)
        if rows >= self.rows_min_batch or key[3] == rows:  # below the switch, only a launch measured at that many rows
            measured = self.rows.get(key)
            if measured is not None and rows <= self.max_rows(measured.kernel):
                return measured
        if self.batched in ("cuda", "rowwise") and 2 <= rows <= self.max_rows(self.batched):
            return RowsLaunch(self.batched)
        if rows < self.rows_min_batch:
            return RowsLaunch("row", self.gemv_config(n, k, gated))
        if self.batched == "stream":
            return RowsLaunch("stream", self.stream_gemv, prefetch=self.stream_prefetch)
        if self.batched == "tma":
            return RowsLaunch("tma", self.tma_gemv)
        return RowsLaunch("tensor", self.rows_gemv, self.rows_target_programs, self.rows_prefetch)


DEFAULT_POLICY = LaunchPolicy()
# The variants being measured (engine "fast-split"): attention split over the context, and
# split-K until a batched projection has about two programs per SM of an H100/H200 (132 SMs).
SPLIT_POLICY = LaunchPolicy(attention="split", rows_target_programs=264)


def gemv_config(n: int, k: int, gated: bool) -> LaunchConfig:
    """The default policy's launch shape for an [n, k] matrix."""
    return DEFAULT_POLICY.gemv_config(n, k, gated)
