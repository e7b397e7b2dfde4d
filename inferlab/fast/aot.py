"""Compile the decode kernels for a GPU architecture without the GPU: the CPU interpreter runs
their arithmetic, this checks what only the compiler sees (types across branches and loops,
register pressure, spills).

    python -m inferlab.fast.aot              # sm_90 (Hopper), TinyLlama-1.1B and SmolLM2-135M shapes
    python -m inferlab.fast.aot --arch 80

Each kernel is compiled by Triton to a cubin for the target (`ptxas` ships with Triton) and its
resource usage read back with `cuobjdump`. Exit 1 if a kernel fails to compile or spills (to local
memory or to the stack frame, where ptxas puts spilled registers); a kernel of SPILLS_ONCE may
spill outside its loops only. Run it with TRITON_INTERPRET unset: under the interpreter
`triton.jit` does not compile.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Compiled:
    kernel: str
    case: str
    registers: int
    local_bytes: int
    stack_bytes: int  # ptxas puts spilled registers in the stack frame: a spill as much as local memory
    shared_bytes: int
    loop_spills: int  # spill loads and stores inside a loop of the machine code: paid every iteration

    @property
    def spills(self) -> bool:
        """A spill this project does not accept: any at all, except a kernel of SPILLS_ONCE spilling
        outside its loops."""
        if self.kernel in SPILLS_ONCE:
            return bool(self.local_bytes or self.loop_spills)
        return bool(self.local_bytes or self.stack_bytes)


# Kernels allowed to spill outside their loops, and why. The sampling kernel holds a row of 32,000
# weights in registers (32 a thread at 1024 threads, half the register file); at its end the
# uniform draws join them for the race, and ~200 bytes a thread go to the stack once.
SPILLS_ONCE = {"_sample_step_kernel"}


def _pointer(dtype: str) -> str:
    return "*" + dtype


def _tma_case(kernels, types: dict, n: int, k: int, gated: bool, config, prefetch: int, label: str,
              early: bool = False, rms_at_once: bool | None = None):
    """`_gemv_tma_kernel` on an [n, k] bf16 matrix at 16 rows in `config`, as `gemv_tma` launches
    it: K split for 132 SMs, the first `prefetch` tiles of each program asked of L2, with `early`
    the first tile copied before the wait, the RMS pass at once or in tiles as `rms_at_once` says
    (None: as the default policy runs it)."""
    if rms_at_once is None:
        rms_at_once = kernels.LaunchPolicy().rms_at_once
    n_tiles, k_tiles = -(-n // config.block_n), -(-k // config.block_k)
    split_k = kernels.tma.tma_split_k(n_tiles, k_tiles, 132)
    tiles = kernels.tma.tma_prefetch_tiles(prefetch, k_tiles, split_k)
    flags = dict(N=n, K=k, NORM=n != 2048, GATED=gated, RESIDUAL=n == 2048, BLOCK_M=16, BLOCK_N=config.block_n,
                 BLOCK_K=config.block_k, SPLIT_K=split_k, PDL=True, FP32=False, RMS_M=16,
                 RMS_K=kernels.rms_columns(16, k), PREFETCH=tiles, LINE=64, INTERPRETED=False, EARLY=early,
                 RMS_AT_ONCE=rms_at_once)
    return (f"{label} {n}x{k} split-K {split_k}{f' prefetch {tiles}' if tiles else ''}{' early' if early else ''}"
            f"{'' if rms_at_once else ' RMS in tiles'}",
            kernels.tma._gemv_tma_kernel,
            dict(types, w_desc=f"tensordesc<bf16[{config.block_n}, {config.block_k}]>"), flags,
            dict(num_warps=config.num_warps, num_stages=config.num_stages))


def _ahead_flags(kernels, shape: tuple[int, int], gated: bool, programs: int, warps: int) -> dict:
    """The AHEAD_* constexprs of a kernel of `programs` programs asking L2 for the first 8 MB of a
    bf16 weight of `shape` (`LaunchPolicy(l2_ahead=8 << 20)`)."""
    import torch

    weight = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    plan = kernels.ahead.ahead_plan(weight, 8 << 20, programs, 32 * warps, gated)
    return dict(kernels.ahead.ahead_operands(weight, plan, weight)[1], INTERPRETED=False)


def _cases(kernels) -> list[tuple[str, object, dict, dict, dict]]:
    """(case, kernel, argument types, constexprs, launch options): each kernel in the shapes the engine launches."""
    bf16, fp32, i32, i64 = _pointer("bf16"), _pointer("fp32"), _pointer("i32"), _pointer("i64")
    # ahead_ptr: the input (unread) where no weight is asked of L2, the next weight's bytes where one is
    gemv = dict(x_ptr=bf16, w_ptr=bf16, norm_ptr=bf16, res_ptr=bf16, out_ptr=bf16, M="i32", eps="fp32", ahead_ptr=bf16)
    attention = dict(qkv_ptr=bf16, cos_ptr=bf16, sin_ptr=bf16, pos_ptr=i64, k_ptr=bf16, v_ptr=bf16, out_ptr=bf16,
                     stride_cm="i32", stride_ch="i32", stride_ct="i32", scale="fp32", ahead_ptr=bf16)
    ahead = dict(ahead_ptr=_pointer("u8"))
    split = dict(attention, part_acc_ptr=fp32, part_best_ptr=fp32, part_total_ptr=fp32, arrivals_ptr=i32)
    greedy = dict(logits_ptr=fp32, embed_ptr=bf16, hidden_ptr=bf16, tokens_ptr=i64, out_ptr=i64, pos_ptr=i64,
                  arrivals_ptr=i32, M="i32", out_stride="i32", first_position="i32")
    cases = []
    # the measured shapes, then SmolLM2's narrow matrices in one tile wider than K (masked), each
    # as it runs and with its loads issued early (LaunchPolicy(early_loads=True))
    one_row = [(n, k, gated, config) for (n, k, gated), config in kernels.MEASURED_GEMV.items()]
    for (n, k, gated, config), early in itertools.product(one_row, (False, True)):
        flags = dict(N=n, K=k, NORM=True, GATED=gated, RESIDUAL=not gated, BLOCK_N=config.block_n,
                     BLOCK_K=config.block_k, EVEN_N=n % config.block_n == 0, EVEN_K=k % config.block_k == 0, PDL=True,
                     EARLY=early)
        cases.append((f"gemv {n}x{k} tile {config.block_n}x{config.block_k}{' early loads' if early else ''}",
                      kernels.projections._gemv_kernel, gemv, flags, dict(num_warps=config.num_warps, num_stages=config.num_stages)))
    # all of K in one tile (`perf_tests/scripts/fast_targets.py`'s "k-whole" cases): each program's
    # whole share of the weight loaded before the wait
    # (and [q; k; v] in 4 rows, o in 8, [gate; up] in 2: fewer registers held across the wait, for
    # the programs of the kernel after to sit beside them; the "room" cases)
    for (n, k, gated), config in (((2560, 2048, False), kernels.LaunchConfig(2, 2048, 4, 1)),
                                  ((2560, 2048, False), kernels.LaunchConfig(4, 2048, 4, 1)),
                                  ((2048, 2048, False), kernels.LaunchConfig(4, 2048, 4, 1)),
                                  ((2048, 2048, False), kernels.LaunchConfig(8, 2048, 4, 1)),
                                  ((5632, 2048, True), kernels.LaunchConfig(2, 2048, 4, 1)),
                                  ((2048, 5632, False), kernels.LaunchConfig(2, 8192, 8, 1))):
        flags = dict(N=n, K=k, NORM=n != 2048, GATED=gated, RESIDUAL=n == 2048, BLOCK_N=config.block_n,
                     BLOCK_K=config.block_k, EVEN_N=True, EVEN_K=k % config.block_k == 0, PDL=True, EARLY=True)
        cases.append((f"gemv {n}x{k} tile {config.block_n}x{config.block_k} whole K", kernels.projections._gemv_kernel,
                      gemv, flags, dict(num_warps=config.num_warps, num_stages=config.num_stages)))
    # with the next matrix's first 8 MB asked of L2 at the end (LaunchPolicy(l2_ahead=8 MB)): o asking
    # for [gate; up] (each half), [gate; up] for down
    for (n, k, gated), (after, after_gated) in ((((2048, 2048, False)), ((11264, 2048), True)),
                                                (((5632, 2048, True)), ((2048, 5632), False))):
        config = kernels.MEASURED_GEMV[n, k, gated]
        flags = dict(N=n, K=k, NORM=gated, GATED=gated, RESIDUAL=not gated, BLOCK_N=config.block_n,
                     BLOCK_K=config.block_k, EVEN_N=True, EVEN_K=True, PDL=True, EARLY=True,
                     **_ahead_flags(kernels, after, after_gated, -(-n // config.block_n), config.num_warps))
        cases.append((f"gemv {n}x{k} tile {config.block_n}x{config.block_k} L2 ahead",
                      kernels.projections._gemv_kernel, dict(gemv, **ahead), flags, dict(num_warps=config.num_warps, num_stages=config.num_stages)))
    rows = kernels.DEFAULT_POLICY.rows_gemv
    # (n, k, norm, gated, residual, split-K): [q; k; v], [gate; up] and down as the batched step runs them
    # and the same with the first weight tile loaded before the wait (LaunchPolicy(rows_prefetch=True))
    for n, k, norm, gated, residual, split_k, prefetch in (
            (2560, 2048, True, False, False, 1, False), (5632, 2048, True, True, False, 1, False),
            (5632, 2048, True, True, False, 2, False), (2048, 5632, False, False, True, 1, False),
            (2048, 5632, False, False, True, 8, False), (2560, 2048, True, False, False, 1, True),
            (5632, 2048, True, True, False, 1, True), (2048, 5632, False, False, True, 8, True)):
        flags = dict(N=n, K=k, NORM=norm, GATED=gated, RESIDUAL=residual, BLOCK_M=16, BLOCK_N=rows.block_n,
                     BLOCK_K=rows.block_k, EVEN_N=True, EVEN_K=True, SPLIT_K=split_k, PDL=True, FP32=False,
                     PREFETCH=prefetch, RMS_M=0, RMS_K=0)
        cases.append((f"rows {n}x{k} split-K {split_k}{' prefetch' if prefetch else ''}", kernels.projections._gemv_rows_kernel,
                      dict(gemv, part_ptr=fp32, arrivals_ptr=i32), flags,
                      dict(num_warps=rows.num_warps, num_stages=rows.num_stages)))
    for n, k, gated, rms_m in ((2560, 2048, False, 4), (5632, 2048, True, 4), (2560, 2048, False, 16),
                               (32000, 2048, False, 8)):  # the RMS pass in wide tiles (LaunchPolicy(wide_rms=True))
        flags = dict(N=n, K=k, NORM=True, GATED=gated, RESIDUAL=False, BLOCK_M=16, BLOCK_N=rows.block_n,
                     BLOCK_K=rows.block_k, EVEN_N=True, EVEN_K=True, SPLIT_K=1, PDL=True, FP32=False, PREFETCH=False,
                     RMS_M=rms_m, RMS_K=kernels.rms_columns(rms_m, k))
        cases.append((f"rows {n}x{k} wide RMS over {rms_m} rows", kernels.projections._gemv_rows_kernel,
                      dict(gemv, part_ptr=fp32, arrivals_ptr=i32), flags,
                      dict(num_warps=rows.num_warps, num_stages=rows.num_stages)))
    stream = kernels.STREAM_GEMV
    # the stream-K kernel (LaunchPolicy(batched="stream")) on TinyLlama's matrices at 16 rows, two programs per SM
    # of an H100/H200
    # (the first unit loaded before the wait: RowsLaunch("stream", prefetch=True))
    # (and with its weight tiles through a TMA descriptor: LaunchPolicy(stream_tma=True))
    for (n, k, gated), prefetch, tma in itertools.product(((2560, 2048, False), (2048, 2048, False), (5632, 2048, True),
                                                           (2048, 5632, False), (32000, 2048, False)), (False, True),
                                                          (False, True)):
        n_tiles, k_tiles = -(-n // stream.block_n), -(-k // stream.block_k)
        programs = min(264, n_tiles * k_tiles)
        flags = dict(N=n, K=k, NORM=n != 2048, GATED=gated, RESIDUAL=n == 2048, BLOCK_M=16, BLOCK_N=stream.block_n,
                     BLOCK_K=stream.block_k, EVEN_K=k % stream.block_k == 0,
                     PROGRAMS=programs, SLOTS=kernels.stream.stream_slots(n_tiles, k_tiles, programs), PDL=True,
                     FP32=False, PREFETCH=prefetch, RMS_M=16, RMS_K=kernels.rms_columns(16, k), TMA=tma)
        types = dict(gemv, part_ptr=fp32, arrivals_ptr=i32,
                     w_desc=f"tensordesc<bf16[{stream.block_n}, {stream.block_k}]>" if tma else "constexpr")
        if not tma:
            flags["w_desc"] = None
        cases.append((f"stream {n}x{k} {programs} programs{' prefetch' if prefetch else ''}{' TMA' if tma else ''}",
                      kernels.stream._gemv_stream_kernel, types, flags,
                      dict(num_warps=stream.num_warps, num_stages=stream.num_stages)))
    # the TMA kernel (LaunchPolicy(batched="tma"), the default from 4 rows) on TinyLlama's matrices
    # as the batched step splits them over 132 SMs, in its tiles (the LM head's own), and with the
    # L2 prefetch of 1, 2 or 4 tiles ([q; k; v], o and down's 1 and [gate; up]'s 4 by default,
    # `MEASURED_ROWS`; LaunchPolicy(tma_prefetch=2))
    tma_types = dict(gemv, part_ptr=fp32, arrivals_ptr=i32)
    for (n, k, gated), prefetch in itertools.product(((2560, 2048, False), (2048, 2048, False), (5632, 2048, True),
                                                      (2048, 5632, False), (32000, 2048, False)), (0, 1, 2, 4)):
        config = kernels.MEASURED_ROWS.get((n, k, gated, 16), kernels.RowsLaunch("tma")).config or kernels.TMA_GEMV
        cases.append(_tma_case(kernels, tma_types, n, k, gated, config, prefetch, label="tma"))
    # o asking L2 for [gate; up]'s first 8 MB after its loop (LaunchPolicy(l2_ahead=8 MB))
    case, kernel, types, flags, options = _tma_case(kernels, tma_types, 2048, 2048, False, kernels.TMA_GEMV, 0, label="tma")
    flags.update(_ahead_flags(kernels, (11264, 2048), True, 32 * flags["SPLIT_K"], options["num_warps"]))
    cases.append((f"{case} L2 ahead", kernel, dict(types, **ahead), flags, options))
    # and as `perf_tests/scripts/fast_targets.py` launches it beside the default: two stages with
    # each program's tiles (up to 8) asked of L2 before the wait (a program small enough to share
    # an SM with the previous kernel's), and the narrow matrices in tiles of 16 or 32 weight rows
    # (so K is split less: not at all, or in two for o and down in tiles of 32) with their tiles
    # (up to 8) asked of L2; [gate; up] in the same narrow tiles fills every SM (352 or 176 tiles
    # against 88); and with the first tile copied into shared memory before the wait
    # (LaunchPolicy(tma_early=True)), in two stages and in tiles of 16
    for (n, k, gated), config in itertools.product(
            ((2560, 2048, False), (2048, 2048, False), (5632, 2048, True), (2048, 5632, False)),
            (kernels.LaunchConfig(64, 256, 4, 2), kernels.LaunchConfig(16, 256, 4, 4), kernels.LaunchConfig(32, 256, 4, 4))):
        for early in (False, True) if config.block_n != 32 else (False,):  # and the first tile copied before the wait
            cases.append(_tma_case(kernels, tma_types, n, k, gated, config, 8,
                                   label=f"tma {config.block_n}x{config.block_k} s{config.num_stages}", early=early))
    # [q; k; v] and down in deeper pipelines (`fast_targets.py`'s "s4" and "s5" cases): 4 or 5 stages
    # of 64 x 256, each within an SM's shared memory
    for (n, k), stages in itertools.product(((2560, 2048), (2048, 5632)), (4, 5)):
        cases.append(_tma_case(kernels, tma_types, n, k, False, kernels.LaunchConfig(64, 256, 4, stages), 1,
                               label=f"tma 64x256 s{stages}"))
    # the norm kernels at 16 rows with the RMS pass as a loop over its tiles (LaunchPolicy(rms_at_once=False))
    for (n, k, gated), config in (((2560, 2048, False), kernels.TMA_GEMV), ((5632, 2048, True), kernels.TMA_GEMV),
                                  ((32000, 2048, False), kernels.TMA_HEAD)):
        cases.append(_tma_case(kernels, tma_types, n, k, gated, config, 1, label="tma", rms_at_once=False))
    for rows in (2, 4, 8):  # the CUDA-core batch kernel (LaunchPolicy(batched="cuda")) at its row counts
        # (n, k, norm, gated, residual, early, wide): as it runs; down with its residual loaded early
        # (LaunchPolicy(early_loads=True)); [q; k; v] with its RMS pass in wide tiles (LaunchPolicy(wide_rms=True))
        for n, k, norm, gated, residual, early, wide in (
                (2560, 2048, True, False, False, False, False), (5632, 2048, True, True, False, False, False),
                (2048, 5632, False, False, True, False, False), (32000, 2048, True, False, False, False, False),
                (2048, 5632, False, False, True, True, False), (2560, 2048, True, False, False, False, True)):
            config = kernels.batch_config(rows, gated)
            flags = dict(N=n, K=k, NORM=norm, GATED=gated, RESIDUAL=residual, ROWS=rows, BLOCK_N=config.block_n,
                         BLOCK_K=config.block_k, EVEN_N=True, EVEN_K=True, PDL=True, EARLY=early,
                         RMS_K=kernels.rms_columns(rows, k) if wide else 0)
            cases.append((f"batch {rows} rows {n}x{k}{' early loads' if early else ''}{' wide RMS' if wide else ''}",
                          kernels.projections._gemv_batch_kernel, gemv, flags,
                          dict(num_warps=config.num_warps, num_stages=config.num_stages)))
    # one row at a time (LaunchPolicy(batched="rowwise")) in the one-row kernel's shapes, at 4 and 8 rows
    # (and o, [q; k; v] with K whole, as fast_targets' "rowwise k-whole" cases run them)
    whole = {(2560, 2048, False): kernels.LaunchConfig(2, 2048, 4, 1), (2048, 2048, False): kernels.LaunchConfig(2, 2048, 4, 1)}
    for ((n, k, gated), config), rows in itertools.product([*kernels.TINYLLAMA_GEMV.items(), *whole.items()], (4, 8)):
        flags = dict(N=n, K=k, NORM=True, GATED=gated, RESIDUAL=not gated, ROWS=rows, BLOCK_N=config.block_n,
                     BLOCK_K=config.block_k, EVEN_N=True, EVEN_K=True, PDL=True, EARLY=False, RMS_K=0, ROWWISE=True)
        cases.append((f"rowwise {rows} rows {n}x{k} tile {config.block_n}x{config.block_k}",
                      kernels.projections._gemv_batch_kernel, gemv, flags,
                      dict(num_warps=config.num_warps, num_stages=config.num_stages)))
    for (n, k, gated, rows), launch in kernels.TENSOR_ROWS.items():  # measured per matrix, in their own shapes
        if launch.kernel == "cuda" and launch.config is not None:
            config = launch.config
            flags = dict(N=n, K=k, NORM=True, GATED=gated, RESIDUAL=not gated, ROWS=rows, BLOCK_N=config.block_n,
                         BLOCK_K=config.block_k, EVEN_N=n % config.block_n == 0, EVEN_K=k % config.block_k == 0,
                         PDL=True, EARLY=False, RMS_K=0)
            cases.append((f"batch {rows} rows {n}x{k} tile {config.block_n}x{config.block_k}",
                          kernels.projections._gemv_batch_kernel, gemv, flags,
                          dict(num_warps=config.num_warps, num_stages=config.num_stages)))
    for heads, kv_heads, label in ((32, 4, "TinyLlama"), (9, 3, "SmolLM2")):
        group = heads // kv_heads
        g_pad = 1 << (group - 1).bit_length()
        head = dict(attention, part_acc_ptr=fp32, part_best_ptr=fp32, part_total_ptr=fp32, arrivals_ptr=i32)
        # one program per head; ranges of 256 or 128 positions; the last range to finish merging them
        for positions, ranges, last in ((0, 1, False), (256, 8, False), (128, 16, False), (128, 2, True),
                                        (128, 16, True)):
            flags = dict(NH=heads, KVH=kv_heads, HD=64, BLOCK_T=kernels.ATTENTION_BLOCK_T, RANGE=positions,
                         RANGES=ranges, G_PAD=g_pad, PDL=True, LAST=last)
            cases.append((f"attention {label}{f' {ranges} ranges of {positions}' if positions else ''}"
                          f"{', merged by the last' if last else ''}",
                          kernels.attention._attention_decode_kernel, head, flags, dict(num_warps=4)))
        # a whole 256-position cache in one tile of 8 warps (LaunchPolicy(head_block_t=256, head_range=256,
        # head_warps=8)): one range, no combine kernel
        flags = dict(NH=heads, KVH=kv_heads, HD=64, BLOCK_T=256, RANGE=0, RANGES=1, G_PAD=g_pad, PDL=True, LAST=False)
        cases.append((f"attention {label} 256 positions in one tile, 8 warps", kernels.attention._attention_decode_kernel,
                      head, flags, dict(num_warps=8)))
        # ranges of 128 asking L2 for o's weight before the wait (LaunchPolicy(l2_ahead=8 MB))
        flags = dict(NH=heads, KVH=kv_heads, HD=64, BLOCK_T=kernels.ATTENTION_BLOCK_T, RANGE=128, RANGES=2,
                     G_PAD=g_pad, PDL=True, LAST=False,
                     **_ahead_flags(kernels, (heads * 64, heads * 64), False, heads * 2, 4))
        cases.append((f"attention {label} 2 ranges of 128, L2 ahead", kernels.attention._attention_decode_kernel,
                      dict(head, **ahead), flags, dict(num_warps=4)))
        # the attention and o in one kernel (LaunchPolicy(attention_o_cache=256)): o's rows in blocks of
        # 256, the whole cache (or its first 128 positions) read before the wait, 8 or 16 warps; and of
        # 512 at 16 warps over 64 positions. Blocks of 128 spill at 4, 8 and 16 warps, of 512 over 128
        # positions or more. `attention_o_registers=128` spills 280 bytes once: measured, not checked here
        fused = dict({k: v for k, v in attention.items() if k != "ahead_ptr"}, wo_ptr=bf16, res_ptr=bf16, part_ptr=fp32,
                     arrivals_ptr=i32)
        for block_n, block_t, warps in ((256, 256, 8), (256, 256, 16), (256, 128, 8), (512, 64, 16)):
            flags = dict(N=heads * 64, NH=heads, NH_PAD=1 << (heads - 1).bit_length(), KVH=kv_heads, HD=64,
                         BLOCK_T=block_t, BLOCK_N=block_n, PDL=True)
            cases.append((f"attention and o {label}, o rows {block_n}, {block_t} positions, {warps} warps",
                          kernels.attention_fused._attention_o_kernel, fused, flags, dict(num_warps=warps)))
        # the [q; k; v] projection and the attention in one launch (LaunchPolicy(qkv_attention_cache=256)),
        # in the projection's measured shape, each head's first 32 cached positions loaded before its
        # wait. 64 or more spill at TinyLlama's 4 warps (128 at SmolLM2's 8); and so does a cap on the
        # registers (`qkv_attention_registers` 48-80, so that the projection's programs all fit at
        # once): measured, not checked here
        nqkv, hidden = (heads + 2 * kv_heads) * 64, 2048 if heads == 32 else 576
        config = kernels.gemv_config(nqkv, hidden, False)
        fused_qkv = dict(attention, x_ptr=bf16, w_ptr=bf16, norm_ptr=bf16, counts_ptr=i32, errors_ptr=i32, M="i32",
                         eps="fp32")
        fused_qkv.pop("ahead_ptr")
        for block_t in (32,):
            flags = dict(K=hidden, NH=heads, KVH=kv_heads, HD=64, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                         EVEN_K=hidden % config.block_k == 0, BLOCK_T=block_t, PDL=True, EARLY=True,
                         SPIN=kernels.persistent.SPIN_LIMIT, INTERPRETED=False)
            cases.append((f"[q; k; v] and attention {label}, {block_t} positions before the wait",
                          kernels.projection_attention._qkv_attention_kernel, fused_qkv, flags,
                          dict(num_warps=config.num_warps, num_stages=config.num_stages)))
        for block_t in (16, 32):
            for combine in (True, False):
                flags = dict(NH=heads, KVH=kv_heads, HD=64, G=group, G_PAD=g_pad, SPLITS=kernels.MAX_SPLITS,
                             BLOCK_T=block_t, CHUNK=kernels.combine_chunk(kernels.MAX_SPLITS, g_pad, 64),
                             COMBINE=combine, PDL=True)
                cases.append((f"split attention {label} tile {block_t}{'' if combine else ' partials'}",
                              kernels.attention._attention_split_kernel, split, flags, dict(num_warps=4)))
        for splits in (8, kernels.MAX_SPLITS):
            flags = dict(NH=heads, KVH=kv_heads, HD=64, G=group, G_PAD=g_pad, SPLITS=splits, PDL=True)
            cases.append((f"split combine {label} {splits} ranges", kernels.attention._attention_combine_kernel,
                          dict(part_acc_ptr=fp32, part_best_ptr=fp32, part_total_ptr=fp32, out_ptr=bf16), flags,
                          dict(num_warps=2)))
    layers = dict({name: bf16 for name in ("hidden_ptr", "xs_ptr", "qkv_ptr", "attn_ptr", "h_ptr", "wqkv_ptr", "wo_ptr",
                                           "w13_ptr", "w2_ptr", "norm1_ptr", "norm2_ptr", "cos_ptr", "sin_ptr", "k_ptr",
                                           "v_ptr")},
                  pos_ptr=i64, bar_ptr=i32, err_ptr=i32, phase_first="i32", phase_last="i32", stride_cl="i32",
                  stride_ch="i32", stride_ct="i32", eps="fp32", scale="fp32")
    # every layer in one kernel (LaunchPolicy(persistent=True)), one program per SM of an H100/H200
    for hidden, inner, heads, kv_heads, label in ((576, 1536, 9, 3, "SmolLM2"), (2048, 5632, 32, 4, "TinyLlama")):
        nqkv, programs = (heads + 2 * kv_heads) * 64, 132
        tiles = {"QKV": kernels.tile_shape(nqkv, hidden, programs, False),
                 "O": kernels.tile_shape(hidden, heads * 64, programs, False),
                 "13": kernels.tile_shape(inner, hidden, programs, True), "2": kernels.tile_shape(hidden, inner, programs, False)}
        flags = dict(H=hidden, I=inner, NH=heads, KVH=kv_heads, HD=64, NPROG=programs, BLOCK_T=64,
                     SPIN=kernels.persistent.SPIN_LIMIT, SYNC=True, **{f"BN_{m}": s[0] for m, s in tiles.items()},
                     **{f"BK_{m}": s[1] for m, s in tiles.items()})
        cases.append((f"layers {label} in one kernel, {programs} programs", kernels.persistent._decode_layers_kernel,
                      layers, flags, dict(num_warps=8)))
    for one_row in (True, False):
        flags = dict(V=32000, H=2048, BLOCK_V=kernels.GREEDY_BLOCK_V, BLOCK_H=1024, ONE_ROW=one_row)
        cases.append((f"greedy step {'one row' if one_row else 'rows'}", kernels.step._greedy_step_kernel, greedy, flags,
                      dict(num_warps=kernels.GREEDY_WARPS)))
    sample = dict(greedy, uniform_ptr=fp32, weights_ptr=fp32, temperature="fp32", top_p="fp32", top_k="i32")
    # TinyLlama's vocabulary, with and without top-k, and the largest the kernel takes
    # (SAMPLE_MAX_VOCAB); top-p by candidates first (the default) and by bisection alone
    for vocab, hidden, top_k, top_p, candidates in (
            (32000, 2048, False, True, kernels.SAMPLE_CANDIDATES), (32000, 2048, True, True, kernels.SAMPLE_CANDIDATES),
            (kernels.SAMPLE_MAX_VOCAB, 2048, True, True, kernels.SAMPLE_CANDIDATES), (32000, 2048, False, True, 0),
            (32000, 2048, True, True, 0)):
        block = 1 << (vocab - 1).bit_length()
        flags = dict(V=vocab, H=hidden, BLOCK_V=block, BLOCK_H=1024, TEMPERATURE=True, TOP_K=top_k, TOP_P=top_p,
                     ONE_ROW=False, CANDIDATES=candidates)
        how = f"{candidates} candidates" if candidates else "bisection"
        cases.append((f"sample step vocab {vocab}{' top-k' if top_k else ''} top-p {how}",
                      kernels.step._sample_step_kernel, sample, flags, dict(num_warps=kernels.sample_warps(block))))
    split_sample = dict(sample, part_ptr=fp32, bar_ptr=i32, err_ptr=i32, phase_first="i32", phase_last="i32")
    # over many programs a row (LaunchPolicy(sampling="split")): TinyLlama's and SmolLM2's vocabularies
    for vocab, hidden, top_k, top_p in ((32000, 2048, False, True), (32000, 2048, True, True),
                                        (49152, 576, False, True), (32000, 2048, False, False)):
        programs = kernels.split_programs(vocab)
        flags = dict(V=vocab, H=hidden, P=programs, PP=1 << (programs - 1).bit_length(), CHUNK=kernels.SPLIT_CHUNK,
                     SUB=kernels.sampling.SUB, PB=kernels.sampling.PARTIAL_BLOCK, BLOCK_H=1024,
                     ROUNDS=kernels.sampling.ROUNDS, TEMPERATURE=True, TOP_K=top_k, TOP_P=top_p, ONE_ROW=False,
                     SYNC=True, SPIN=kernels.grid.SPIN_LIMIT)
        cases.append((f"split sample vocab {vocab}{' top-k' if top_k else ''}{' top-p' if top_p else ''}",
                      kernels.sampling._sample_split_kernel, split_sample, flags,
                      dict(num_warps=kernels.sampling.SPLIT_WARPS)))
    return cases


def defaults(kernel) -> dict:
    """The kernel's constexpr arguments that have a default, with it: `triton.jit` fills them in at a
    launch, `triton.compile` does not."""
    import inspect

    return {name: p.default for name, p in inspect.signature(kernel.fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def aligned(kernel, signature: dict) -> dict:
    """Every pointer argument marked 16-byte aligned, as `triton.jit` specializes a launch with
    torch's tensors (their storage is aligned): without it the compiler cannot use 16-byte
    loads, nor the asynchronous copies that pipeline a loop, and compiles another kernel."""
    return {(kernel.arg_names.index(name),): [["tt.divisibility", 16]]
            for name, kind in signature.items() if kind.startswith("*")}


def _resources(cubin: bytes, cuobjdump: str) -> tuple[int, int, int, int]:
    """(registers, local bytes, stack bytes, shared bytes) of the one kernel in `cubin`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        report = subprocess.run([cuobjdump, "--dump-resource-usage", file.name], capture_output=True, text=True,
                                check=True).stdout
    fields = dict(re.findall(r"(REG|LOCAL|STACK|SHARED):(\d+)", report))
    return int(fields["REG"]), int(fields["LOCAL"]), int(fields.get("STACK", 0)), int(fields["SHARED"])


def loop_spills(sass: str) -> int:
    """Spill loads and stores (LDL, STL) between a backward branch and its target, in
    `cuobjdump -sass` text: the instructions a loop repeats."""
    code = [(int(a, 16), op) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = [(int(target, 16), at) for at, op in code if "BRA" in op
             for target in re.findall(r"0x([0-9a-f]+)", op) if int(target, 16) < at]
    return sum(1 for at, op in code if re.search(r"\b(LDL|STL)\b", op) and any(lo <= at <= hi for lo, hi in loops))


def _sass(cubin: bytes, cuobjdump: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        return subprocess.run([cuobjdump, "-sass", file.name], capture_output=True, text=True, check=True).stdout


def compile_all(arch: int) -> list[Compiled]:
    """Every case of `_cases`, compiled for sm_<arch>; raises what the compiler raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from inferlab.fast import kernels

    cuobjdump = os.path.join(triton.__path__[0], "backends", "nvidia", "bin", "cuobjdump")
    target = GPUTarget("cuda", arch, 32)
    results = []
    for case, kernel, types, constexprs, options in _cases(kernels):
        signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
        constexprs = {**{name: value for name, value in defaults(kernel).items() if signature[name] == "constexpr"},
                      **constexprs}
        binary = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=aligned(kernel, signature)),
                                target=target, options=options)
        registers, local, stack, _ = _resources(binary.asm["cubin"], cuobjdump)
        in_loops = loop_spills(_sass(binary.asm["cubin"], cuobjdump)) if local or stack else 0
        # Triton's shared memory is dynamic, so the cubin's static count misses it
        results.append(Compiled(kernel.__name__, case, registers, local, stack, binary.metadata.shared, in_loops))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.fast.aot", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90: Hopper)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("inferlab.fast.aot: unset TRITON_INTERPRET (the interpreter does not compile)", file=sys.stderr)
        return 2
    results = compile_all(args.arch)
    for r in results:
        print(f"sm_{args.arch}  {r.case:40s} {r.kernel:26s} registers {r.registers:3d}  local {r.local_bytes:5d} B  "
              f"stack {r.stack_bytes:5d} B  shared {r.shared_bytes:6d} B  spills in loops {r.loop_spills}")
    spilled = [r.case for r in results if r.spills]
    if spilled:
        print(f"spills to local memory or the stack: {', '.join(spilled)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
