"""The end of a sampled decode step spread over many programs a row (`LaunchPolicy(sampling="split")`).

The token is the one `inferlab.fast.engine.pick` draws: temperature, top-k, top-p, then the
exponential race argmax(p / -log u). One program holding a whole row (`sample_step`) is bound by
that one SM: its elementwise work (IEEE divisions, exp, log) for 32,000 logits, and ~31 halvings
of each threshold, each a reduction over the row. Here each program takes CHUNK logits of a row
and the programs of a row agree on each threshold by radix selection: four rounds of 8 key bits,
each a weighted histogram of 256 bins a program (a product of two one-hot matrices), summed over
the programs in program order, so that every program draws the same conclusion from the same
numbers. Between phases the programs of a row meet at a grid barrier (`inferlab.fast.kernels.grid`).

Phases, each a pass over the program's chunk (the logits are read again, from L1 or L2, rather
than held: the chunk is walked in SUB-logit tiles):

- top-k (if asked), 4 rounds: the smallest key t with count(key <= t) > V - k, keys the logits'
  order (IEEE bits, the negative half reversed, offset to [0, 2^32)); every logit with key >= t
  is kept, ties at the k-th place included, as torch's top-k does;
- the row's maximum;
- top-p, 4 rounds over the weights e = exp(x - max) (their IEEE bits are in order, e >= 0): the
  smallest weight w with sum(e <= w) > (1 - p) sum(e); every weight >= w is kept; the first round
  also gives sum(e). Without top-p, one phase sums e;
- the race: each program's best argmax(p / -log u) over its kept tokens; the last program of the
  row to finish takes the best of them (the first of equal values, as torch.argmax) and ends the
  step as `greedy_step` does.

These are the thresholds the bisection of `sample_step` finds; the sums are added in another
order, so a threshold within rounding of 1 - p may fall the other way. Under the interpreter, each
phase is a launch of its own (`SYNC=False`): a launch recomputes the earlier phases' conclusions
from the histograms they stored.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from inferlab.decode.sampling import SamplingConfig
from inferlab.fast.kernels.grid import SPIN_LIMIT, _grid_arrive, _grid_wait, interpreted, wait_errors
from inferlab.fast.kernels.launch import kept
from inferlab.fast.kernels.step import _finish_step, thresholds

CHUNK, SUB = 1024, 256  # logits a program; logits a tile of its pass
BINS, ROUNDS = 256, 4  # 8 key bits a round, 32 bits
SPLIT_WARPS = 4
# registers an SM over the registers of a warp at 128 a thread (the kernel takes 96-116 at 4
# warps on sm_90, `inferlab.fast.aot`): the warps of resident programs `split_fits` accepts an SM
RESIDENT_WARPS = 65536 // (128 * 32)
PARTIAL_BLOCK = 32  # programs' histograms summed a block at a time


@triton.jit
def _logits(logits_ptr, row, offs, temperature, V: tl.constexpr, TEMPERATURE: tl.constexpr):
    """x / temperature for this row's logits at offs, -inf past the vocabulary."""
    x = tl.load(logits_ptr + row * V + offs, mask=offs < V, other=float("-inf"))
    if TEMPERATURE:
        x = tl.math.div_rn(x, temperature)
    return x


@triton.jit
def _logit_key(x):
    """float32 -> int64 in [0, 2^32) in the same order: the IEEE bits, the negative half reversed, offset."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64) + 2147483648


@triton.jit
def _kept_logits(logits_ptr, row, offs, temperature, top_k_key, V: tl.constexpr, TEMPERATURE: tl.constexpr,
                 TOP_K: tl.constexpr):
    """The logits after temperature and top-k (-inf for the tokens it removes)."""
    x = _logits(logits_ptr, row, offs, temperature, V, TEMPERATURE)
    if TOP_K:
        x = tl.where(_logit_key(x) >= top_k_key, x, float("-inf"))
    return x


@triton.jit
def _histogram(key, w, prefix, SHIFT: tl.constexpr):
    """[16, 16]: of the elements whose key bits above SHIFT + 8 equal `prefix`, the sum of w by
    the 8 key bits at SHIFT (high nibble, low nibble): a product of two one-hot matrices."""
    sixteen = tl.arange(0, 16)
    digit = (key >> SHIFT) & 255
    match = (key >> (SHIFT + 8)) == prefix
    high = tl.where(match[:, None] & ((digit >> 4)[:, None] == sixteen[None, :]), 1.0, 0.0)
    low = tl.where((digit & 15)[:, None] == sixteen[None, :], w[:, None], 0.0)
    return tl.dot(tl.trans(high), low, input_precision="ieee")


@triton.jit
def _store_histogram(slot_ptr, hist):
    sixteen = tl.arange(0, 16)
    tl.store(slot_ptr + sixteen[:, None] * 16 + sixteen[None, :], hist)


@triton.jit
def _top_k_partial(slot_ptr, logits_ptr, row, base, temperature, prefix, V: tl.constexpr, CHUNK: tl.constexpr,
                   SUB: tl.constexpr, SHIFT: tl.constexpr, TEMPERATURE: tl.constexpr):
    hist = tl.zeros([16, 16], dtype=tl.float32)
    for s0 in range(0, CHUNK, SUB):
        offs = base + s0 + tl.arange(0, SUB)
        key = _logit_key(_logits(logits_ptr, row, offs, temperature, V, TEMPERATURE))
        hist += _histogram(key, tl.where(offs < V, 1.0, 0.0), prefix, SHIFT)
    _store_histogram(slot_ptr, hist)


@triton.jit
def _top_p_partial(slot_ptr, logits_ptr, row, base, temperature, top_k_key, row_max, prefix, V: tl.constexpr,
                   CHUNK: tl.constexpr, SUB: tl.constexpr, SHIFT: tl.constexpr, TEMPERATURE: tl.constexpr,
                   TOP_K: tl.constexpr):
    hist = tl.zeros([16, 16], dtype=tl.float32)
    for s0 in range(0, CHUNK, SUB):
        offs = base + s0 + tl.arange(0, SUB)
        e = tl.exp(_kept_logits(logits_ptr, row, offs, temperature, top_k_key, V, TEMPERATURE, TOP_K) - row_max)
        hist += _histogram(e.to(tl.int32, bitcast=True).to(tl.int64), e, prefix, SHIFT)
    _store_histogram(slot_ptr, hist)


@triton.jit
def _max_partial(slot_ptr, logits_ptr, row, base, temperature, top_k_key, V: tl.constexpr, CHUNK: tl.constexpr,
                 SUB: tl.constexpr, TEMPERATURE: tl.constexpr, TOP_K: tl.constexpr):
    best = tl.full([SUB], float("-inf"), dtype=tl.float32)
    for s0 in range(0, CHUNK, SUB):
        offs = base + s0 + tl.arange(0, SUB)
        best = tl.maximum(best, _kept_logits(logits_ptr, row, offs, temperature, top_k_key, V, TEMPERATURE, TOP_K))
    tl.store(slot_ptr, tl.max(best, axis=0))


@triton.jit
def _sum_partial(slot_ptr, logits_ptr, row, base, temperature, top_k_key, row_max, V: tl.constexpr,
                 CHUNK: tl.constexpr, SUB: tl.constexpr, TEMPERATURE: tl.constexpr, TOP_K: tl.constexpr):
    total = tl.zeros([SUB], dtype=tl.float32)
    for s0 in range(0, CHUNK, SUB):
        offs = base + s0 + tl.arange(0, SUB)
        total += tl.exp(_kept_logits(logits_ptr, row, offs, temperature, top_k_key, V, TEMPERATURE, TOP_K) - row_max)
    tl.store(slot_ptr, tl.sum(total, axis=0))


@triton.jit
def _race_partial(slot_ptr, logits_ptr, uniform_ptr, row, base, temperature, top_k_key, row_max, top_p_key, kept_total,
                  V: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr, TEMPERATURE: tl.constexpr,
                  TOP_K: tl.constexpr, TOP_P: tl.constexpr):
    """This program's best race value p / -log u over its kept tokens and its token (the first of
    equal values); -1 where it keeps none."""
    best = tl.full((), -2.0, dtype=tl.float32)
    best_at = tl.full((), 0, dtype=tl.int32)
    for s0 in range(0, CHUNK, SUB):
        offs = base + s0 + tl.arange(0, SUB)
        e = tl.exp(_kept_logits(logits_ptr, row, offs, temperature, top_k_key, V, TEMPERATURE, TOP_K) - row_max)
        if TOP_P:
            e = tl.where(e.to(tl.int32, bitcast=True).to(tl.int64) >= top_p_key, e, 0.0)
        p = tl.math.div_rn(e, kept_total)
        u = tl.load(uniform_ptr + row * V + offs, mask=offs < V, other=0.5)
        race = tl.where(p > 0.0, tl.math.div_rn(p, -tl.log(tl.maximum(u, 1e-20))), -1.0)
        top = tl.max(race, axis=0)
        at = tl.min(tl.where(race == top, offs, 2147483647), axis=0)
        better = top > best  # strict: an earlier tile's equal value stays
        best_at = tl.where(better, at, best_at)
        best = tl.where(better, top, best)
    tl.store(slot_ptr, best)
    tl.store(slot_ptr + 1, best_at.to(tl.float32))  # exact: tokens < 2^24


@triton.jit
def _radix_decide(phase_ptr, prefix, below, above, top_p, P: tl.constexpr, PB: tl.constexpr,
                  FROM_TOTAL: tl.constexpr):
    """One round's conclusion from the programs' histograms [P, 256] at phase_ptr: the bin b of
    the smallest key with mass(key <= it) > below among the keys that start with `prefix`
    (FROM_TOTAL: below is (1 - top_p) x the mass of every bin, top-p's first round). Returns the
    longer prefix, the mass still to pass inside b, the mass kept above b so far and the mass of b."""
    bins = tl.arange(0, 256)
    hist = tl.zeros([256], dtype=tl.float32)
    for p0 in range(0, P, PB):
        rows = p0 + tl.arange(0, PB)
        tile = tl.load(phase_ptr + rows[:, None] * 256 + bins[None, :], mask=rows[:, None] < P, other=0.0,
                       cache_modifier=".cg")
        hist += tl.sum(tile, axis=0)
    if FROM_TOTAL:
        below = (1.0 - top_p) * tl.sum(hist, axis=0)
    cumulative = tl.cumsum(hist, axis=0)
    b = tl.min(tl.where(cumulative > below, bins, 256), axis=0)
    # rounding can leave no bin over: then the last bin with any mass
    b = tl.where(b == 256, tl.max(tl.where(hist > 0.0, bins, 0), axis=0), b)
    lower = tl.sum(tl.where(bins < b, hist, 0.0), axis=0)
    upper = tl.sum(tl.where(bins > b, hist, 0.0), axis=0)
    here = tl.sum(tl.where(bins == b, hist, 0.0), axis=0)
    return prefix * 256 + b.to(tl.int64), below - lower, above + upper, here


@triton.jit
def _first_values(phase_ptr, P: tl.constexpr, PP: tl.constexpr):
    """Each program's first stored value of a phase, [PP] (0 past P)."""
    programs = tl.arange(0, PP)
    return tl.load(phase_ptr + programs * 256, mask=programs < P, other=0.0, cache_modifier=".cg"), programs < P


@triton.jit
def _meet(bar_ptr, err_ptr, ph: tl.constexpr, P: tl.constexpr, SYNC: tl.constexpr, SPIN: tl.constexpr):
    if SYNC:
        _grid_arrive(bar_ptr)
        _grid_wait(bar_ptr, err_ptr, (ph + 1) * P, SPIN)


@triton.jit
def _sample_split_kernel(
    logits_ptr, uniform_ptr, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr, part_ptr, bar_ptr,
    err_ptr, M, out_stride, first_position, temperature, top_p, top_k, phase_first, phase_last,
    V: tl.constexpr, H: tl.constexpr, P: tl.constexpr, PP: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr,
    PB: tl.constexpr, BLOCK_H: tl.constexpr, ROUNDS: tl.constexpr, TEMPERATURE: tl.constexpr, TOP_K: tl.constexpr,
    TOP_P: tl.constexpr, ONE_ROW: tl.constexpr, SYNC: tl.constexpr, SPIN: tl.constexpr,
):
    """Program (j, m): logits [j CHUNK, (j + 1) CHUNK) of row m, phases [phase_first, phase_last)
    (all of them with SYNC; the conclusions of earlier phases are read back from part_ptr). A
    phase's conclusion is drawn where a later phase of the launch needs it: after its barrier with
    SYNC, else in the launch after it, from what every program stored."""
    j = tl.program_id(0)
    m = tl.program_id(1)
    row = m.to(tl.int64)
    base = j * CHUNK
    MAX_PHASE: tl.constexpr = ROUNDS * TOP_K
    RACE: tl.constexpr = MAX_PHASE + 1 + (ROUNDS if TOP_P else 1)
    row_part = part_ptr + row * ((RACE + 1) * P * 256)
    row_bar = bar_ptr + m

    concluding = phase_last > RACE  # the race is in this launch: every earlier conclusion is needed
    top_k_key = tl.full((), 0, dtype=tl.int64)
    if TOP_K:
        below = (V - top_k).to(tl.float32)
        prefix = tl.full((), 0, dtype=tl.int64)
        above = tl.full((), 0.0, dtype=tl.float32)
        here = tl.full((), 0.0, dtype=tl.float32)
        for r in tl.static_range(ROUNDS):
            if (phase_first <= r) & (r < phase_last):
                _top_k_partial(row_part + (r * P + j) * 256, logits_ptr, row, base, temperature, prefix, V, CHUNK,
                               SUB, 24 - 8 * r, TEMPERATURE)
                _meet(row_bar, err_ptr, r, P, SYNC, SPIN)
            if concluding | (r < phase_first):
                prefix, below, above, here = _radix_decide(row_part + r * P * 256, prefix, below, above, 0.0, P, PB,
                                                           False)
        top_k_key = prefix

    row_max = tl.full((), 0.0, dtype=tl.float32)
    if (phase_first <= MAX_PHASE) & (MAX_PHASE < phase_last):
        _max_partial(row_part + (MAX_PHASE * P + j) * 256, logits_ptr, row, base, temperature, top_k_key, V, CHUNK,
                     SUB, TEMPERATURE, TOP_K)
        _meet(row_bar, err_ptr, MAX_PHASE, P, SYNC, SPIN)
    if concluding | (MAX_PHASE < phase_first):
        values, real = _first_values(row_part + MAX_PHASE * P * 256, P, PP)
        row_max = tl.max(tl.where(real, values, float("-inf")), axis=0)

    top_p_key = tl.full((), 0, dtype=tl.int64)
    kept_total = tl.full((), 1.0, dtype=tl.float32)
    if TOP_P:
        below = tl.full((), 0.0, dtype=tl.float32)
        prefix = tl.full((), 0, dtype=tl.int64)
        above = tl.full((), 0.0, dtype=tl.float32)
        here = tl.full((), 0.0, dtype=tl.float32)
        for r in tl.static_range(ROUNDS):
            ph = MAX_PHASE + 1 + r
            if (phase_first <= ph) & (ph < phase_last):
                _top_p_partial(row_part + (ph * P + j) * 256, logits_ptr, row, base, temperature, top_k_key, row_max,
                               prefix, V, CHUNK, SUB, 24 - 8 * r, TEMPERATURE, TOP_K)
                _meet(row_bar, err_ptr, ph, P, SYNC, SPIN)
            if concluding | (ph < phase_first):  # every weight is in the first round's bins: the total
                prefix, below, above, here = _radix_decide(row_part + ph * P * 256, prefix, below, above, top_p, P,
                                                           PB, r == 0)
        top_p_key = prefix
        kept_total = above + here
    else:
        SUM: tl.constexpr = MAX_PHASE + 1
        if (phase_first <= SUM) & (SUM < phase_last):
            _sum_partial(row_part + (SUM * P + j) * 256, logits_ptr, row, base, temperature, top_k_key, row_max, V,
                         CHUNK, SUB, TEMPERATURE, TOP_K)
            _meet(row_bar, err_ptr, SUM, P, SYNC, SPIN)
        if concluding | (SUM < phase_first):
            values, real = _first_values(row_part + SUM * P * 256, P, PP)
            kept_total = tl.sum(values, axis=0)

    if (phase_first <= RACE) & (RACE < phase_last):
        race_ptr = row_part + RACE * P * 256
        _race_partial(race_ptr + j * 256, logits_ptr, uniform_ptr, row, base, temperature, top_k_key, row_max,
                      top_p_key, kept_total, V, CHUNK, SUB, TEMPERATURE, TOP_K, TOP_P)
        tl.debug_barrier()  # every thread's stores issued before the count
        before = RACE * P if SYNC else 0
        if tl.atomic_add(row_bar, 1, sem="acq_rel", scope="gpu") == before + P - 1:  # the row's last program
            values, real = _first_values(race_ptr, P, PP)
            at = tl.load(race_ptr + tl.arange(0, PP) * 256 + 1, mask=real, other=0.0, cache_modifier=".cg")
            values = tl.where(real, values, -3.0)
            top = tl.max(values, axis=0)
            token = tl.min(tl.where(values == top, at, V), axis=0).to(tl.int32)
            tl.atomic_xchg(row_bar, 0)  # every program of the row is past its last wait
            pos = tl.load(pos_ptr)
            _finish_step(token, m, pos, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr, M,
                         out_stride, first_position, H, BLOCK_H, ONE_ROW)


def split_programs(vocab: int, chunk: int = CHUNK) -> int:
    """Programs a row: one per `chunk` logits."""
    return -(-vocab // chunk)


def split_fits(rows: int, vocab: int, sms: int, chunk: int = CHUNK, warps: int = SPLIT_WARPS) -> bool:
    """Whether every program of a launch for `rows` rows can be resident at once (a grid barrier
    needs it): at most RESIDENT_WARPS warps of programs an SM (4 programs of 4 warps)."""
    return rows * split_programs(vocab, chunk) <= sms * max(1, RESIDENT_WARPS // warps)


def split_phases(sampling: SamplingConfig, vocab: int) -> int:
    """Phases of a launch: top-k's rounds, the maximum, top-p's rounds (or the sum), the race."""
    top_k, top_p = thresholds(sampling, vocab)
    return ROUNDS * (top_k > 0) + 1 + (ROUNDS if top_p < 1.0 else 1) + 1


def sample_step_split(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    uniform: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    position: torch.Tensor,
    first_position: int,
    *,
    chunk: int = CHUNK,
    sub: int = SUB,
    phases: Sequence[int] | None = None,
    warps: int = SPLIT_WARPS,
) -> None:
    """Same contract as `inferlab.fast.kernels.sample_step`, over `split_programs(V, chunk)`
    programs a row that meet at grid barriers: one launch on a GPU, one per phase under the
    interpreter. On a GPU every program must be resident at once (`split_fits`); a wait that
    gives up counts in `barrier_errors`. `sub`: logits a tile of a program's pass (a power of two
    that divides `chunk`). `phases`: launch only these phases, one launch each, without barriers
    (as under the interpreter); a phase reads the earlier phases' conclusions from the histograms
    they stored, so they must have run on the same logits and draws before: to time each phase
    alone (``perf_tests/scripts/sampling_kernels.py``). `warps`: a program's warps (`split_fits`
    with the same warps says whether the grid fits)."""
    M, V = logits.shape
    H = embed.shape[1]
    assert logits.dtype == torch.float32 and uniform.shape == logits.shape and uniform.dtype == torch.float32
    assert logits.is_contiguous() and uniform.is_contiguous() and embed.is_contiguous() and hidden.is_contiguous()
    assert out.stride(1) == 1 and chunk % sub == 0
    top_k, top_p = thresholds(sampling, V)
    P = split_programs(V, chunk)
    count = split_phases(sampling, V)
    device = logits.device
    part, bar, arrivals = kept(("sample-split", device, M, P, count), lambda: (
        torch.zeros(M, count, P, BINS, device=device, dtype=torch.float32),
        torch.zeros(M, device=device, dtype=torch.int32), torch.zeros(1, device=device, dtype=torch.int32)))
    operands = (logits, uniform, embed, hidden, tokens, out, position, arrivals, part, bar, wait_errors(device), M,
                out.stride(0), first_position, float(sampling.temperature), top_p, top_k)
    flags = dict(V=V, H=H, P=P, PP=triton.next_power_of_2(P), CHUNK=chunk, SUB=sub, PB=min(PARTIAL_BLOCK, triton.next_power_of_2(P)),
                 BLOCK_H=1024, ROUNDS=ROUNDS, TEMPERATURE=sampling.temperature != 1.0, TOP_K=top_k > 0, TOP_P=top_p < 1.0,
                 ONE_ROW=M == 1, SPIN=SPIN_LIMIT, num_warps=warps)
    if phases is None and not interpreted():
        _sample_split_kernel[(P, M)](*operands, 0, count, SYNC=True, **flags)
        return
    # one launch a phase: under the interpreter, programs run one after another and a barrier would never open
    for phase in range(count) if phases is None else phases:
        if not 0 <= phase < count:
            raise ValueError(f"this sampling has phases 0 to {count - 1}, not {phase}")
        _sample_split_kernel[(P, M)](*operands, phase, phase + 1, SYNC=False, **flags)
