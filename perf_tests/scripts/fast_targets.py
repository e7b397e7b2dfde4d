"""The fast engine against its targets: every case in one run, beside hf, hf-static and eager.

    PYTHONPATH=. python3 perf_tests/scripts/fast_targets.py --out results/targets

On CUDA in bf16, greedy unless said, CUDA events, `--warmup` + `--runs` requests per case:

- the reference shape (`--model`, batch 1, prompt 128, 128 new tokens) for fast, hf, hf-static
  and eager;
- the fast engine without early loads (`LaunchPolicy(early_loads=False)`) at the reference shape,
  and with its prefill as before (`FastOptions(prefill_cache_write="index", prefill_head="torch")`)
  at the reference shape and at prompt `--long-prompt`;
- the fast engine at each `--batch-sizes` (from 4 rows also without the batched launches measured
  per matrix, `LaunchPolicy(rows={})`, with each matrix in the stream-K launch timed fastest for
  it alone, `STREAM_FASTEST`, and with only down and o in it; in the tensor-core kernel with its
  own table as before the TMA kernel, `LaunchPolicy(batched="tensor", rows=TENSOR_ROWS)`; and
  in the TMA kernel at two programs per SM, with each program's first 1, 2 or 8 weight tiles
  asked of L2 before the wait, with the narrow matrices in tiles of 32 or 16 weight rows (and
  their tiles asked of L2 before the wait; in tiles of 16 also with [gate; up], and with each
  program's first tile copied before the wait, `LaunchPolicy(tma_early=True)`), and in two
  stages with and without that (and with `tma_early`); with a matrix's own request of L2
  (`RowsLaunch.l2_tiles`): [gate; up] asking for 0-8 tiles, [q; k; v] and o for 2, [q; k; v], o
  and down for none (`l2 0`, as before their one tile was the default), the LM head for one;
  at 2 and 3 rows in the TMA kernel instead of one program per row; from 4 rows with the decode
  attention over ranges of 256 positions instead of 128; at every batch size, batch 1 included,
  with each kernel asking L2 for the first 8 or 24 MB of the next kernel's weight while it runs,
  and with only the attention asking, for o's, `LaunchPolicy(l2_ahead=...)`), at prompt `--long-prompt`, with
  temperature 0.7 and top-p 0.9 sampling (the step ending in the sampling kernel of one program
  a row, the default; the same with top-p found by bisection alone,
  `LaunchPolicy(sample_candidates=0)`; in the split sampling kernel,
  `LaunchPolicy(sampling="split")`; and in compiled torch ops, `LaunchPolicy(sampling="torch")`),
  and on `--small-model` (the embedded SmolLM2, real weights)
  when it loads, there also without early loads, in the default launch shape instead of its own
  measured ones, with `persistent` (every layer in one kernel), and with the next weight's first
  8 MB asked of L2 (`l2 ahead 8M`).

Designs measured and left off by default are recorded with the run that measured them in
docs/perf/h200/targets-2.md, docs/perf/h100/targets-3.md and docs/perf/h100/stream-k.md (the
CUDA-core batch kernel, one row at a time or all rows at once, wide RMS tiles, the ranges merged
by the last, the persistent kernel at TinyLlama's size, the stream-K kernel for every matrix at 1
or 2 programs per SM, with its first unit loaded early, and at batch 1).

Then, per model, the correctness of the default fast engine (`teacher_forced_check`): its greedy
tokens against the eager loop's, and both one's logit error against an fp32 reference on the
same tokens, which must be of the same size. targets.json is rewritten after each case, so a run
stopped part-way keeps the cases it timed. `--uncompiled-prefill` runs every fast case's prefill
uncompiled, to compare decode steps on a fresh machine without an inductor compile per case (TTFT
is then not the engine's, and its targets are left out; so is the torch sample step of `fast
sampled torch`). Each target (`targets`) is judged on the p50 of its case: an absolute bound in ms, or a multiple
of another case's p50. The table says met or missed with both numbers; the JSON keeps every
case's raw runs. Exit 0 when every case ran (targets met or not), 1 when one failed.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from inferlab.decode.sampling import SamplingConfig
from inferlab.fast.check import teacher_forced_check
from inferlab.fast.engine import FastEngine, FastOptions
from inferlab.measure import fingerprint, roofline
from inferlab.measure.bench import BenchConfig, build_prompt, run_benchmark
from inferlab.model.registry import load_model
from inferlab.storage import new_run_folder, write_json_atomic

SAMPLED = SamplingConfig(greedy=False, temperature=0.7, top_p=0.9)


@dataclass(frozen=True)
class Case:
    """One measured configuration: `name` keys the targets."""

    name: str
    engine: str
    model: str
    batch_size: int = 1
    prompt_length: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    launch: tuple = ()  # LaunchPolicy keywords as (name, value) pairs; (): the default policy
    options: tuple = ()  # FastOptions keywords other than `launch`, as (name, value) pairs


@dataclass(frozen=True)
class Target:
    """`metric` (p50 of "tpot_ms" or "ttft_ms") of `case` at most `bound` ms, or at most `bound` x
    the same metric of `relative_to`."""

    case: str
    metric: str
    bound: float
    relative_to: str | None = None

    def describe(self) -> str:
        unit = f"x {self.relative_to}" if self.relative_to else "ms"
        return f"{self.metric.removesuffix('_ms').upper()} <= {self.bound:g} {unit}"


# each of TinyLlama's matrices in the stream-K kernel in the launch shape (block_n, block_k, warps,
# stages) and programs that `kernel_configs.py --probe-rows 4,16` timed fastest for it alone on an
# H100 at 4 and 16 rows (docs/perf/h100/stream-k.md)
STREAM_FASTEST = {(5632, 2048, True): ((64, 128, 4, 3), 264), (2048, 5632, False): ((64, 128, 4, 4), 132),
                  (32000, 2048, False): ((64, 256, 4, 3), 132), (2560, 2048, False): ((64, 256, 4, 3), 132),
                  (2048, 2048, False): ((64, 128, 4, 4), 132)}
# the two matrices the tensor-core kernel leaves with 64 programs, half an H100/H200's SMs
NARROW_OUTPUTS = ((2048, 5632, False), (2048, 2048, False))


# the LM head's TMA tile at batches (`kernels.TMA_HEAD`'s fields: the default's launch for it)
TMA_HEAD_FIELDS = (128, 128, 4, 3)
# TinyLlama's narrow matrices (N, K): [q; k; v], o, down
NARROW_TMA = ((2560, 2048), (2048, 2048), (2048, 5632))


def narrow_tma(batch: int, block_n: int, gated: bool = False) -> tuple:
    """The `rows_added` launch pair that runs `NARROW_TMA`'s matrices (and with `gated` [gate; up]
    too) at `batch` rows in TMA tiles of `block_n` weight rows x 256 columns, 4 stages."""
    rows = min(16, 1 << (batch - 1).bit_length())
    matrices = [(n, k, False) for n, k in NARROW_TMA] + ([(5632, 2048, True)] if gated else [])
    return ("rows_added", tuple(((n, k, g, rows), ("tma", (block_n, 256, 4, 4))) for n, k, g in matrices))


# TinyLlama's matrices with all of K in one tile of the one-row kernel, so that a program loads
# its whole share of the weight before the wait: the measured launch (MEASURED_GEMV) loads the
# first of two tiles there for [q; k; v] and o, the first of three for down
WHOLE_K = {"qkv": ((2560, 2048, False), (2, 2048, 4, 1)), "o": ((2048, 2048, False), (2, 2048, 4, 1)),
           "o n4": ((2048, 2048, False), (4, 2048, 4, 1)), "down": ((2048, 5632, False), (2, 8192, 8, 1)),
           "qkv n4": ((2560, 2048, False), (4, 2048, 4, 1)), "o n8": ((2048, 2048, False), (8, 2048, 4, 1)),
           "gate/up n2": ((5632, 2048, True), (2, 2048, 4, 1))}


def whole_k(*names: str) -> tuple:
    """The `gemv_added` launch pair that runs `WHOLE_K`'s `names` in their one-tile shapes."""
    return ("gemv_added", tuple(WHOLE_K[name] for name in names))


def stream_per_matrix(rows: int, matrices=tuple(STREAM_FASTEST)) -> tuple:
    """`LaunchPolicy.rows` pairs that run each of `matrices` at `rows` rows in its `STREAM_FASTEST` launch."""
    return tuple(((n, k, gated, rows), ("stream", *STREAM_FASTEST[n, k, gated])) for n, k, gated in matrices)


def cases(model: str, small_model: str | None, batch_sizes: list[int], long_prompt: int) -> list[Case]:
    """The reference shape for every engine, then the fast engine's other cases."""
    found = [Case(f"{engine} b1", engine, model) for engine in ("fast", "hf", "hf-static", "eager")]
    # the one-row kernel's loads issued after the reductions they do not wait on, as before early loads
    found.append(Case("fast b1 no early_loads", "fast", model, launch=(("early_loads", False),)))
    # the prefill's cache write scattered by position and its end in torch operations, as before
    before = (("prefill_cache_write", "index"), ("prefill_head", "torch"))
    found.append(Case("fast b1 prefill as before", "fast", model, options=before))
    # each kernel asking L2 for the first 8 or 24 MB of the next kernel's weight while it runs (the
    # attention for o's, a projection for the next matrix's once its own are in, the LM head for
    # the first layer's [q; k; v]); and only the attention asking, for o's (`LaunchPolicy(l2_ahead=...)`)
    found += l2_ahead_cases(model, 1)
    # o, [q; k; v] and o, and those and down in one tile as wide as K: each program's whole share of
    # the weight loaded before the wait (o's while the attention runs, which reads almost nothing)
    found += [Case(f"fast b1 {label} k-whole", "fast", model, launch=(whole_k(*names),))
              for label, names in (("o", ("o",)), ("o n4", ("o n4",)), ("qkv+o", ("qkv", "o")),
                                   ("qkv+o+down", ("qkv", "o", "down")))]
    # room for [gate; up] beside the kernels before it (registers a thread on sm_90, `inferlab.fast.aot`;
    # the share of the register file a kernel's programs hold while they wait): o's 1024 default
    # programs (47) hold 73% while they wait on the attention, which leaves an SM room for one
    # [gate; up] program (4 rows, 119), so little of its 46 MB is asked for before o ends. o in 4 or
    # 8 rows a program (56, 96) holds 42% or 36%: room for two [gate; up] programs of 4 rows, or
    # four of 2 rows (72); [q; k; v] in 4 rows (72) holds 68% instead of 91%
    found += [Case(f"fast b1 room {label}", "fast", model, launch=(whole_k(*names),))
              for label, names in (("gate/up n2", ("gate/up n2",)), ("o n4+gate/up n2", ("o n4", "gate/up n2")),
                                   ("o n8", ("o n8",)), ("o n8+gate/up n2", ("o n8", "gate/up n2")),
                                   ("qkv n4+o n4+gate/up n2", ("qkv n4", "o n4", "gate/up n2")))]
    found += [Case(f"fast b{b}", "fast", model, batch_size=b) for b in batch_sizes if b != 1]
    # the defaults before a cache of up to 256 positions was read in one tile at up to 4 rows
    # (`head_whole_cache`, `head_whole_rows`) and o ran one row at a time at 4 rows (`MEASURED_ROWS`)
    found += [Case(f"fast b{b} previous defaults", "fast", model, batch_size=b,
                   launch=(("head_whole_cache", 0),
                           *((("rows_added", (((2048, 2048, False, 4), ("tma", None)),)),) if b == 4 else ())))
              for b in sorted({1, *batch_sizes}) if b <= 4]
    # [gate; up] in TMA tiles of 64 x 128, 3 stages (96 KB of shared memory, so two programs share an
    # SM), K split to two programs per SM: every SM busy where the default's 88 tiles of 64 x 256 leave
    # 44 idle; and, at up to 8 rows, o (and [q; k; v]) one row at a time in the one-row kernel's
    # whole-K tile, loaded before the wait
    found += [Case(f"fast b{b} gate/up k128 s3 2/SM", "fast", model, batch_size=b,
                   launch=(("rows_added", (((5632, 2048, True, min(16, 1 << (b - 1).bit_length())),
                                            ("tma", (64, 128, 4, 3), 264)),)),))
              for b in batch_sizes if b >= 4]
    found += [Case(f"fast b{b} {label} rowwise k-whole", "fast", model, batch_size=b,
                   launch=(("rows_added", tuple(((*WHOLE_K[name][0], 1 << (b - 1).bit_length()),
                                                 ("rowwise", WHOLE_K[name][1])) for name in names)),))
              for b in batch_sizes if 4 <= b <= 8 for label, names in (("o", ("o",)), ("qkv+o", ("qkv", "o")))]
    # at 4 rows, down and [gate; up] one row at a time in the one-row kernel's tiles (4 or 2 weight
    # rows x 2048 columns), as o runs by default: register kernels that can share an SM with the
    # TMA kernel before them and load their weights before the wait, where a TMA program (120-217
    # KB of shared memory) starts only once the one before it on its SM has left
    found += [Case(f"fast b4 {label} rowwise n{n}", "fast", model, batch_size=4,
                   launch=(("rows_added", tuple(((*matrix, 4), ("rowwise", (n, 2048, 4, 1))) for matrix in matrices)),))
              for label, matrices in (("down", ((2048, 5632, False),)), ("gate/up", ((5632, 2048, True),)),
                                      ("down+gate/up", ((2048, 5632, False), (5632, 2048, True))))
              for n in (4, 2) if 4 in batch_sizes]
    # at 4 rows, [q; k; v] and down in the TMA kernel split over K into about 80 or 200 programs
    # (the default: about one per SM, 120 and 128)
    found += [Case(f"fast b4 {label} tma {programs} programs", "fast", model, batch_size=4,
                   launch=(("rows_added", (((*matrix, 4), ("tma", None, programs)),)),))
              for label, matrix in (("qkv", (2560, 2048, False)), ("down", (2048, 5632, False)))
              for programs in (80, 200) if 4 in batch_sizes]
    # [gate; up] asking L2 for its first 1, 2, 4 or 8 weight tiles before the wait (at 4 rows after
    # o's register kernel, beside whose programs its TMA programs can start; at 8 and 16 after o's
    # TMA programs); at 4 rows down the same (after [gate; up]'s TMA programs, which leave it no
    # room), and both in two stages (145 and 80 KB of shared memory: one program of each fits an
    # SM) with down's first 8 tiles asked of L2
    tma_s2 = (64, 256, 4, 2)
    # (4, the default since: `MEASURED_ROWS`; 0 as before)
    found += [Case(f"fast b{b} gate/up l2 {tiles}", "fast", model, batch_size=b,
                   launch=(("rows_added", (((5632, 2048, True, b), ("tma", None, 0, False, tiles)),)),))
              for b in batch_sizes if b in (4, 8, 16) for tiles in (0, 1, 2, 4, 8)]
    # the same for o at 8 and 16 rows (TMA programs after the attention's register kernel) and
    # [q; k; v] (after down's TMA programs), with 2 tiles (1, the default since: `MEASURED_ROWS`)
    found += [Case(f"fast b{b} {label} l2 {tiles}", "fast", model, batch_size=b,
                   launch=(("rows_added", (((*matrix, b), ("tma", None, 0, False, tiles)),)),))
              for label, matrix, sizes in (("o", (2048, 2048, False), (8, 16)), ("qkv", (2560, 2048, False), (4, 8, 16)))
              for b in batch_sizes if b in sizes for tiles in (2,)]
    one_tile = {"qkv": (2560, 2048, False), "o": (2048, 2048, False), "down": (2048, 5632, False)}  # (N, K, gated)
    # down and [q; k; v] in deeper pipelines: 4 or 5 stages of 64 x 256 (164 or 205 KB of shared
    # memory at 16 rows, against 123 KB), so that 3 or 4 weight tiles are in flight where the default
    # keeps 2: a program of down holds 6 tiles, of [q; k; v] 3, and alone each matrix read faster the
    # more of its tiles were on the way (docs/perf/h200/tma.md: down 9.26 / 9.12 / 8.92 us with 48 /
    # 64 / 80 KB in flight); each keeps its first tile asked of L2 before the wait (`L2_ONE_TILE`)
    found += [Case(f"fast b{b} {label} s{stages}", "fast", model, batch_size=b,
                   launch=(("rows_added", tuple(((*one_tile[name], b), ("tma", (64, 256, 4, stages), 0, False, 1))
                                                for name in label.split("+"))),))
              for b in batch_sizes if b in (4, 8, 16) for label in ("down", "qkv", "qkv+down") for stages in (4, 5)]
    # the norm kernels' RMS pass as a loop over its tiles, each tile's loads issued after the
    # reduction of the tile before, as before `LaunchPolicy(rms_at_once=True)` (the default: one
    # round trip where the loop takes one a tile, 2 at 8 rows, 4 at 16; at 4 rows the same code)
    found += [Case(f"fast b{b} rms in tiles", "fast", model, batch_size=b, launch=(("rms_at_once", False),))
              for b in batch_sizes if b in (8, 16)]
    # [q; k; v] and o (o at 8 and 16 rows; at 4 it runs one row at a time), down, and all three
    # without asking L2 for their first tile, as before (`L2_ONE_TILE` in `MEASURED_ROWS` asks for
    # it); the LM head (after down's TMA programs) asking for its first
    found += [Case(f"fast b{b} {label} l2 0", "fast", model, batch_size=b,
                   launch=(("rows_added", tuple(((*one_tile[name], b), ("tma", None, 0, False, 0))
                                                for name in label.split("+") if b != 4 or name != "o")),))
              for b in batch_sizes if b in (4, 8, 16) for label in ("qkv+o", "down", "qkv+o+down")]
    found += [Case(f"fast b{b} head l2 1", "fast", model, batch_size=b,
                   launch=(("rows_added", (((32000, 2048, False, b), ("tma", TMA_HEAD_FIELDS, 0, False, 1)),)),))
              for b in batch_sizes if b in (4, 8, 16)]
    found += [Case(f"fast b4 {label}", "fast", model, batch_size=4, launch=(("rows_added", launches),))
              for label, launches in (
                  ("down l2 8", (((2048, 5632, False, 4), ("tma", None, 0, False, 8)),)),
                  ("gate/up+down s2 down l2 8", (((5632, 2048, True, 4), ("tma", tma_s2)),
                                                 ((2048, 5632, False, 4), ("tma", tma_s2, 0, False, 8)))))
              if 4 in batch_sizes]
    found += [case for b in batch_sizes if b != 1 for case in l2_ahead_cases(model, b)]
    # the decode attention over a cache of 256 positions in one tile of 8 warps: each head's keys and
    # values read before the wait, one range, no combine kernel (the default: 2 ranges of 128 and a
    # combine kernel)
    found += [Case(f"fast b{b} t256 w8", "fast", model, batch_size=b,
                   launch=(("head_block_t", 256), ("head_range", 256), ("head_warps", 8)))
              for b in sorted({1, *batch_sizes}) if b == 1 or b >= 4]
    # the same through `LaunchPolicy(head_whole_cache=256)`: caches of up to 256 positions in one
    # tile of 8 warps, longer ones in the default's ranges of 128 (also at the long prompt)
    found += [Case(f"fast b{b} whole256", "fast", model, batch_size=b, launch=(("head_whole_cache", 256),))
              for b in sorted({1, *batch_sizes}) if b == 1 or b >= 4]
    # a layer's attention and o projection in one kernel (`LaunchPolicy(attention_o_cache=256)`):
    # one program per query head and block of 256 of o's output rows, of 8 warps (16), the whole
    # cache read before the wait (its first 128 positions); at 2-8 rows too. At 8 warps a program
    # takes 254 registers a thread, a whole SM's: its 256 programs run in two waves on 132 SMs.
    # In one wave: 128 programs of 512 rows and 16 warps, the first 64 positions read before the
    # wait; or 128 registers a thread (280 bytes spilled once), two programs an SM
    found += [Case(f"fast b1 attention-o{label}", "fast", model,
                   launch=(("attention_o_cache", 256), *extra))
              for label, extra in (("", ()), (" w16", (("attention_o_warps", 16),)),
                                   (" t128", (("attention_o_block_t", 128),)),
                                   (" n512 t64 w16", (("attention_o_block_n", 512), ("attention_o_block_t", 64),
                                                      ("attention_o_warps", 16))),
                                   (" r128", (("attention_o_registers", 128),)))]
    found += [Case(f"fast b{b} attention-o", "fast", model, batch_size=b,
                   launch=(("attention_o_cache", 256), ("attention_o_rows", b))) for b in batch_sizes if 1 < b <= 8]
    # a layer's [q; k; v] projection and attention in one launch (`LaunchPolicy(qkv_attention_cache=256)`):
    # each head's attention program waits on its KV head's rows, not on the projection's end, its
    # first 32 (64) cached positions loaded before. Uncapped, the attention's tiles take 158 (255)
    # registers a thread, so 2-3 of the projection's programs fit on an SM where 10 do in its own
    # kernel (48 registers): capped at 48-80 (ptxas spills the rest, in the attention's part)
    found += [Case(f"fast b1 qkv-attention t{block_t}{f' r{registers}' if registers else ''}", "fast", model,
                   launch=(("qkv_attention_cache", 256), ("qkv_attention_block_t", block_t),
                           ("qkv_attention_registers", registers)))
              for block_t, registers in ((32, 0), (32, 48), (32, 56), (32, 64), (64, 64), (64, 80))]
    # every matrix in the policy-wide batched kernel, without the launches measured per matrix
    # (LaunchPolicy(rows={})): the engine before `MEASURED_ROWS`
    found += [Case(f"fast b{b} rows={{}}", "fast", model, batch_size=b, launch=(("rows", ()),))
              for b in batch_sizes if b >= 4]
    # each matrix in the stream-K kernel's launch timed fastest for it alone
    found += [Case(f"fast b{b} stream per matrix", "fast", model, batch_size=b,
                   launch=(("rows", stream_per_matrix(1 << (b - 1).bit_length())),)) for b in batch_sizes if b >= 4]
    # only down and o in it (the tensor-core kernel's narrowest grids), the rest as measured per matrix
    found += [Case(f"fast b{b} stream down+o", "fast", model, batch_size=b,
                   launch=(("rows_added", stream_per_matrix(1 << (b - 1).bit_length(), NARROW_OUTPUTS)),))
              for b in batch_sizes if b >= 4]
    # the tensor-core kernel with the launches measured per matrix for it (`TENSOR_ROWS`): the
    # batched step before the TMA kernel; and the TMA kernel with K split to two programs per SM
    found += [Case(f"fast b{b} tensor", "fast", model, batch_size=b, launch=(("batched", "tensor"), ("rows", "tensor")))
              for b in batch_sizes if b >= 4]
    found += [Case(f"fast b{b} tma 2/SM", "fast", model, batch_size=b, launch=(("tma_per_sm", 2),))
              for b in batch_sizes if b >= 4]
    # each program's first 1, 2 or (up to) 8 weight tiles asked of L2 before the wait
    found += [Case(f"fast b{b} tma prefetch {p}", "fast", model, batch_size=b, launch=(("tma_prefetch", p),))
              for b in batch_sizes if b >= 4 for p in (1, 2, 8)]
    # the narrow matrices ([q; k; v], o, down) in TMA tiles of 32 or 16 weight rows: more tiles, so
    # K is split less (in tiles of 16 not at all: no partial sums to add after the loop; in tiles
    # of 32, o and down in two)
    found += [Case(f"fast b{b} tma narrow n{n}", "fast", model, batch_size=b, launch=(narrow_tma(b, n),))
              for b in batch_sizes if b >= 4 for n in (32, 16)]
    # the same with each program's tiles (up to 8) asked of L2 before the wait: with K whole, all of
    # a program's weights but down's
    found += [Case(f"fast b{b} tma narrow n{n} prefetch 8", "fast", model, batch_size=b,
                   launch=(("tma_prefetch", 8), narrow_tma(b, n))) for b in batch_sizes if b >= 4 for n in (32, 16)]
    # and [gate; up] in tiles of 16 too: 352 tiles where the default's 64 rows give 88 (88 of the
    # SMs busy), 82 KB of shared memory a program, so two share an SM
    found += [Case(f"fast b{b} tma all n16 prefetch 8", "fast", model, batch_size=b,
                   launch=(("tma_prefetch", 8), narrow_tma(b, 16, gated=True))) for b in batch_sizes if b >= 4]
    # the same, and two stages, with each program's first tile copied into shared memory before
    # the wait (the copy waited on there, the tile kept in registers)
    found += [Case(f"fast b{b} tma all n16 early prefetch 8", "fast", model, batch_size=b,
                   launch=(("tma_prefetch", 8), ("tma_early", True), narrow_tma(b, 16, gated=True)))
              for b in batch_sizes if b >= 4]
    found += [Case(f"fast b{b} tma s2 early prefetch 8", "fast", model, batch_size=b,
                   launch=(("tma_gemv", (64, 256, 4, 2)), ("tma_prefetch", 8), ("tma_early", True)))
              for b in batch_sizes if b >= 4]
    # two stages instead of three (64 KB of weight tiles a program, 128 KB for [gate; up]): a program
    # fits beside the previous kernel's on an SM, so its prefetch runs while that kernel drains
    found += [Case(f"fast b{b} tma s2 prefetch {p}", "fast", model, batch_size=b,
                   launch=(("tma_gemv", (64, 256, 4, 2)), ("tma_prefetch", p))) for b in batch_sizes if b >= 4
              for p in (0, 8)]
    # the stream-K kernel with its weight tiles through TMA, at one and two programs per SM: the work
    # cut evenly over the SMs with the TMA kernel's loads, for every matrix but those with a launch
    # measured for them before the L2 requests of `L2_ONE_TILE` (the LM head, [gate; up], o at 4 rows)
    def streamed(b: int) -> tuple:
        return tuple(((*one_tile[name], b), ("stream", None)) for name in ("qkv", "o", "down") if b != 4 or name != "o")

    found += [Case(f"fast b{b} stream tma {p}/SM", "fast", model, batch_size=b,
                   launch=(("batched", "stream"), ("stream_tma", True), ("stream_per_sm", p), ("rows_added", streamed(b))))
              for b in batch_sizes if b >= 4 for p in (1, 2)]
    # the decode attention over ranges of 256 positions instead of 128: with a batch there are
    # programs enough without the second range, and a cache of 256 then needs no combine kernel
    found += [Case(f"fast b{b} ranges256", "fast", model, batch_size=b, launch=(("head_range", 256), ("head_whole_cache", 0)))
              for b in batch_sizes if b >= 4]
    # 2 and 3 rows in the TMA kernel too, instead of one program per row
    found += [Case(f"fast b{b} tma", "fast", model, batch_size=b, launch=(("rows_min_batch", 2),))
              for b in batch_sizes if 2 <= b < 4]
    found.append(Case(f"fast prompt {long_prompt}", "fast", model, prompt_length=long_prompt))
    found.append(Case(f"fast prompt {long_prompt} whole256", "fast", model, prompt_length=long_prompt,
                      launch=(("head_whole_cache", 256),)))
    found.append(Case(f"fast prompt {long_prompt} prefill as before", "fast", model, prompt_length=long_prompt,
                      options=before))
    # the step ending in the sampling kernel of one program a row (the default; and with top-p
    # by bisection alone), in the split sampling kernel, and in compiled torch ops
    found += [Case("fast sampled", "fast", model, sampling=SAMPLED),
              Case("fast sampled bisection", "fast", model, sampling=SAMPLED, launch=(("sample_candidates", 0),)),
              Case("fast sampled split", "fast", model, sampling=SAMPLED, launch=(("sampling", "split"),)),
              Case("fast sampled torch", "fast", model, sampling=SAMPLED, launch=(("sampling", "torch"),))]
    if small_model:
        # without SmolLM2's own launch shapes (`SMOLLM2_GEMV`): its matrices in the default shape, as before
        gemv = tuple(_launch_shapes_without_smollm2())
        found += [Case(f"fast {small_model}", "fast", small_model),
                  Case(f"fast {small_model} no early_loads", "fast", small_model, launch=(("early_loads", False),)),
                  Case(f"fast {small_model} default shapes", "fast", small_model, launch=(("gemv", gemv),)),
                  # every layer in one persistent kernel, grid barriers between its phases
                  Case(f"fast {small_model} persistent", "fast", small_model, launch=(("persistent", True),)),
                  Case(f"fast {small_model} l2 ahead 8M", "fast", small_model, launch=(("l2_ahead", 8 << 20),)),
                  # four kernels a layer instead of five or six: attention and o in one
                  Case(f"fast {small_model} attention-o", "fast", small_model, launch=(("attention_o_cache", 256),)),
                  # four kernels a layer: [q; k; v] and the attention in one launch (8 warps: 204
                  # registers uncapped at 64 positions, 480 programs of the projection)
                  *[Case(f"fast {small_model} qkv-attention t{block_t}{f' r{registers}' if registers else ''}", "fast",
                         small_model, launch=(("qkv_attention_cache", 256), ("qkv_attention_block_t", block_t),
                                              ("qkv_attention_registers", registers)))
                    for block_t, registers in ((32, 0), (64, 0), (32, 48))]]
    return found


def l2_ahead_cases(model: str, batch_size: int, sizes_mb: tuple[int, ...] = (8, 24)) -> list[Case]:
    """`fast b<batch> l2 ahead <MB>M` for each size, and `... 8M attention` (only the attention asks)."""
    found = [Case(f"fast b{batch_size} l2 ahead {mb}M", "fast", model, batch_size=batch_size,
                  launch=(("l2_ahead", mb << 20),)) for mb in sizes_mb]
    found.append(Case(f"fast b{batch_size} l2 ahead {sizes_mb[0]}M attention", "fast", model, batch_size=batch_size,
                      launch=(("l2_ahead", sizes_mb[0] << 20), ("l2_ahead_from", "attention"))))
    return found


def _launch_shapes_without_smollm2() -> list:
    """`MEASURED_GEMV`'s (key, config) pairs but SmolLM2's; none where Triton is missing (the
    engine then runs no kernels)."""
    try:
        from inferlab.fast.kernels import MEASURED_GEMV, SMOLLM2_GEMV
    except ImportError:
        return []
    return [(key, config) for key, config in MEASURED_GEMV.items() if key not in SMOLLM2_GEMV]


def launch_policy(launch: tuple):
    """A case's LaunchPolicy: its (name, value) pairs as keywords, a mapping's value given as its
    (key, value) pairs (a `rows` launch as its (kernel, config[, programs]) fields; `rows` "tensor":
    `TENSOR_ROWS`); `rows_added`
    pairs are added to the policy's `rows` table instead of replacing it, `gemv_added` pairs (a
    config as its fields) to its `gemv` table."""
    from types import MappingProxyType

    from inferlab.fast.kernels import (TENSOR_ROWS, LaunchConfig, LaunchPolicy,  # needs Triton: only for a policy of its own
                                       RowsLaunch)

    def rows_launch(launch):  # a RowsLaunch, or its fields with the config as a LaunchConfig's fields
        if isinstance(launch, RowsLaunch):
            return launch
        kernel, config, *rest = launch
        return RowsLaunch(kernel, LaunchConfig(*config) if isinstance(config, tuple) else config, *rest)

    def value_of(name, value):
        if name in ("gemv", "gemv_added"):  # a config given as a LaunchConfig or as its fields
            return MappingProxyType({key: LaunchConfig(*c) if isinstance(c, tuple) else c for key, c in value})
        if name == "tma_gemv":
            return LaunchConfig(*value)
        if name == "rows" and value == "tensor":  # the table measured for the tensor-core kernel
            return MappingProxyType(TENSOR_ROWS)
        if name in ("rows", "rows_added"):  # a launch given as (kernel, config[, programs]) or as a RowsLaunch
            return MappingProxyType({key: rows_launch(launch) for key, launch in value})
        return value

    fields = {name: value_of(name, value) for name, value in launch}
    added = fields.pop("rows_added", {})  # launches added to the policy's table (the default's unless `rows`)
    shapes = fields.pop("gemv_added", {})  # one-row launch shapes added to the policy's `gemv` table
    policy = LaunchPolicy(**fields)
    if added:
        policy = replace(policy, rows=MappingProxyType({**policy.rows, **added}))
    return replace(policy, gemv=MappingProxyType({**policy.gemv, **shapes})) if shapes else policy


def uncompiled_prefill(case: Case) -> Case:
    """`case` with its prefill run uncompiled (`FastOptions(compile=False)`): no inductor compile per
    engine. With the Triton kernels `compile` applies to the prefill and to the torch sample step
    alone, so the decode step is the same but in `LaunchPolicy(sampling="torch")`."""
    if case.engine != "fast" or dict(case.options).get("compile") is False:
        return case
    return replace(case, options=(*case.options, ("compile", False)))


def targets(batch_sizes: list[int], long_prompt: int, small_model: str | None, ttft: bool = True) -> list[Target]:
    """The issue's targets for the cases that `cases` makes (batches of 4, 8 and 16 where run);
    without the TTFT targets when `ttft` is False (a run whose prefill is not the engine's)."""
    batch_bounds = {4: 0.70, 8: 0.75, 16: 0.80}
    found = [Target("fast b1", "tpot_ms", 0.60), Target("fast b1", "ttft_ms", 1.5)]
    found += [Target(f"fast b{b}", "tpot_ms", batch_bounds[b]) for b in batch_sizes if b in batch_bounds]
    found += [Target(f"fast prompt {long_prompt}", "tpot_ms", 1.15, relative_to="fast b1"),
              Target(f"fast prompt {long_prompt}", "ttft_ms", 12.0),
              Target("fast sampled", "tpot_ms", 1.05, relative_to="fast b1")]
    if small_model:
        found.append(Target(f"fast {small_model}", "tpot_ms", 0.20))
    return [goal for goal in found if ttft or goal.metric != "ttft_ms"]


def judge(goals: list[Target], p50: dict[str, dict[str, float]]) -> list[dict]:
    """Each target against the measured p50s (`p50[case][metric]` in ms): met, missed, or not run."""
    rows = []
    for goal in goals:
        measured = p50.get(goal.case, {}).get(goal.metric)
        reference = p50.get(goal.relative_to, {}).get(goal.metric) if goal.relative_to else 1.0
        if measured is None or reference is None:
            rows.append({"target": goal.describe(), "case": goal.case, "measured_ms": measured, "limit_ms": None,
                         "verdict": "not run"})
            continue
        limit = goal.bound * reference
        rows.append({"target": goal.describe(), "case": goal.case, "measured_ms": measured, "limit_ms": limit,
                     "ratio": measured / reference if goal.relative_to else None,
                     "verdict": "met" if measured <= limit else "missed"})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| case | target | measured p50 | limit | verdict |", "|---|---|---|---|---|"]
    for row in rows:
        measured = "-" if row["measured_ms"] is None else f"{row['measured_ms']:.4f} ms"
        if row.get("ratio") is not None:
            measured += f" ({row['ratio']:.3f}x)"
        limit = "-" if row["limit_ms"] is None else f"{row['limit_ms']:.4f} ms"
        lines.append(f"| {row['case']} | {row['target']} | {measured} | {limit} | **{row['verdict']}** |")
    return "\n".join(lines)


def measure(case: Case, loaded, bandwidth, engine, output_length: int, warmup: int, runs: int) -> dict:
    bench = BenchConfig(engine=case.engine, prompt_length=case.prompt_length, batch_size=case.batch_size,
                        output_length=output_length, warmup_runs=warmup, runs=runs, sampling=case.sampling)
    start = time.perf_counter()
    result = run_benchmark(loaded, bench, bandwidth, engine=engine)
    summary, fraction = result.summary, result.roofline_summary()["fraction_of_peak"]
    print(f"{case.name}: TTFT p50 {summary['ttft_ms']['p50']:.3f} ms | TPOT p50 {summary['tpot_ms']['p50']:.4f} p99 "
          f"{summary['tpot_ms']['p99']:.4f} ms | {'-' if fraction is None else f'{100 * fraction:.1f}'}% of copy "
          f"bandwidth | prepare {result.prepare_ms / 1e3:.1f} s", flush=True)
    print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    return result.to_dict()


def barrier_check(device: torch.device) -> None:
    """Raise if a grid barrier of the persistent kernel gave up waiting (its programs were not all
    resident at once): its timings and tokens would mean nothing."""
    from inferlab.fast import kernels

    errors = kernels.barrier_errors(device)
    if errors:
        raise RuntimeError(f"{errors} grid-barrier waits of the persistent kernel gave up: its programs were not "
                           "all resident at once")


def error_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"


def fast_engine(engines: dict, case: Case, loaded) -> FastEngine:
    """One engine per model, launch policy and options, kept in `engines`: a new shape then
    captures graphs instead of compiling again."""
    key = (case.model, case.launch, case.options)
    if key not in engines:
        launch = launch_policy(case.launch) if case.launch else None
        engines[key] = FastEngine(loaded.model, FastOptions(launch=launch, **dict(case.options)))
    return engines[key]


def check(loaded, engine: FastEngine, output_length: int, label: str) -> dict:
    """`teacher_forced_check` at the reference shape, printed in one line."""
    prompt = build_prompt(loaded, BenchConfig(engine="fast", output_length=output_length))
    c = teacher_forced_check(loaded, prompt, output_length, engine)
    parted = ("" if c["first_divergence_step"] is None else
              f" (parted at step {c['first_divergence_step']}, where fp32 holds the two tokens "
              f"{c['fp32_gap_where_free_running_parts']:.3f} apart)")
    print(f"correctness {label}: greedy tokens equal to the eager loop's "
          f"{100 * c['greedy_token_agreement_fast_vs_eager']:.0f}%{parted}; max |logit error| vs fp32 fast "
          f"{c['max_abs_logit_err_fast_vs_fp32']:.3f}, eager {c['max_abs_logit_err_eager_vs_fp32']:.3f}; mean fast "
          f"{c['mean_abs_logit_err_fast_vs_fp32']:.4f}, eager {c['mean_abs_logit_err_eager_vs_fp32']:.4f}; top-1 "
          f"agreement with fp32 fast {100 * c['top1_agreement_fast_vs_fp32']:.1f}%, eager "
          f"{100 * c['top1_agreement_eager_vs_fp32']:.1f}%", flush=True)
    return c


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tinyllama-1.1b-random")
    parser.add_argument("--small-model", default="smollm2-135m", help="'' to leave it out")
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--long-prompt", type=int, default=1920)
    parser.add_argument("--output-length", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--device", default="cuda", help="cuda (the real run) or cpu (a smoke test: fp32, no graphs)")
    parser.add_argument("--cases", default=None, metavar="REGEX",
                        help="only the cases whose name this regular expression finds, e.g. 'smollm2' (default: all)")
    parser.add_argument("--uncompiled-prefill", action="store_true",
                        help="run every fast case's prefill uncompiled: no inductor compile per case on a fresh "
                             "machine, the same decode step (compare TPOT; TTFT is then not the engine's and its "
                             "targets are not judged)")
    args = parser.parse_args()
    try:
        chosen = re.compile(args.cases or "")
    except re.error as error:
        print(f"fast_targets: --cases {args.cases!r} is not a regular expression ({error}), e.g. --cases smollm2",
              file=sys.stderr)
        return 2
    try:
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        batch_sizes = []
    if not batch_sizes or min(batch_sizes) < 1 or args.long_prompt < 1:
        print(f"fast_targets: --batch-sizes {args.batch_sizes!r} and --long-prompt {args.long_prompt} must be positive "
              "integers, e.g. --batch-sizes 1,4,8,16", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("fast_targets: needs a CUDA device (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    out = new_run_folder(args.out, "targets")  # a new folder each run: nothing earlier is overwritten
    print(f"writing to {out}", flush=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    env = fingerprint.environment(device)
    bandwidth = roofline.device_bandwidth(device, env["device_name"], probe=True)
    print(f"{env['device_name']} | torch {env['torch']} | transformers {env['transformers']} | "
          f"copy bandwidth {(bandwidth[0] or 0) / 1e9:.0f} GB/s", flush=True)
    small = args.small_model or None
    results, failed, models, engines, correctness = {}, {}, {}, {}, {}

    def save() -> list[dict]:
        """targets.json as it stands, rewritten atomically in this run's own new folder: a run stopped
        part-way keeps its cases."""
        p50 = {name: {metric: result["summary"][metric]["p50"] for metric in ("tpot_ms", "ttft_ms")}
               for name, result in results.items()}
        verdicts = judge(targets(batch_sizes, args.long_prompt, small, ttft=not args.uncompiled_prefill), p50)
        write_json_atomic(out / "targets.json", {"environment": env, "bandwidth": bandwidth,
                                                 "args": vars(args) | {"out": str(args.out)}, "verdicts": verdicts,
                                                 "failed": failed, "correctness": correctness, "results": results},
                          overwrite=True)
        return verdicts

    for case in [c for c in cases(args.model, small, batch_sizes, args.long_prompt) if chosen.search(c.name)]:
        case = uncompiled_prefill(case) if args.uncompiled_prefill else case
        try:
            if case.model not in models:
                models[case.model] = load_model(case.model, device, dtype)
            engine = fast_engine(engines, case, models[case.model]) if case.engine == "fast" else None
            results[case.name] = measure(case, models[case.model], bandwidth, engine, args.output_length, args.warmup,
                                         args.runs)
            if dict(case.launch).get("persistent") and device.type == "cuda":
                barrier_check(device)
        except Exception as error:  # one case failing (a model that does not load, memory) must not hide the rest
            failed[case.name] = error_line(error)
            print(f"{case.name}: FAILED {failed[case.name]}", flush=True)
        save()
    for (model, launch, options), engine in engines.items():
        # the default engine of each model, and one kernel for all layers
        if all(option == ("compile", False) for option in options) and (not launch or dict(launch).get("persistent")):
            name = " ".join([model, *(f"{key}={value}" for key, value in launch)])
            try:
                correctness[name] = check(models[model], engine, args.output_length, name)
            except Exception as error:  # reported; the timings above are still written
                failed[f"correctness {name}"] = error_line(error)
                print(f"correctness {name}: FAILED {failed[f'correctness {name}']}", flush=True)
    verdicts = save()
    print()
    if device.type != "cuda" or args.model != "tinyllama-1.1b-random":
        print(f"(the bounds are the targets for tinyllama-1.1b-random on an H200; {args.model} on {device.type} only "
              "shows that every case runs)")
    print(table(verdicts))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
