"""The end of a decode step, one kernel: the next token (greedy, or drawn with temperature, top-k
and top-p), its embedding for the next step, the tokens written out and the position advanced."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from inferlab.decode.sampling import SamplingConfig
from inferlab.fast.kernels.launch import kept
from inferlab.fast.kernels.policy import GREEDY_BLOCK_V, GREEDY_WARPS, SAMPLE_CANDIDATES


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
    logits_ptr, uniform_ptr, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr, weights_ptr,
    M, out_stride, first_position, temperature, top_p, top_k,
    V: tl.constexpr, H: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    TEMPERATURE: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, ONE_ROW: tl.constexpr,
    CANDIDATES: tl.constexpr = 0,
):
    """One program per row, the row held in registers: temperature, top-k, top-p and the
    exponential race `argmax(p / -log u)`, as `inferlab.fast.engine.pick` does with a sort.

    Top-k keeps every logit >= the k-th largest; top-p every token whose weight e = exp(x - max)
    is >= the smallest weight w with sum(e <= w) > (1 - p) sum(e). Each threshold is found by
    bisection over order keys (the logits' IEEE bits, the negative half reversed; the weights'
    bits as they are, since weights are >= 0), at most 32 halvings, so it is a value of the row,
    exactly, without a sort. Only one array of the row is live at a time (the logits, then the
    weights; the uniform draws at the end).

    With CANDIDATES > 0, top-p first checks the race's winners over the whole row, in race order
    (`_nucleus_race`): the first of them in the nucleus wins the race over the nucleus too, so the
    draw is the same without the threshold, and the bisection runs only when none of the first
    CANDIDATES is in the nucleus (their chance is at most 1 - p each). The weights then go
    through `weights_ptr` (one row of BLOCK_V a program) instead of staying in registers."""
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
    uniform_row = uniform_ptr + m * V
    if TOP_P and CANDIDATES > 0:
        weights_row = weights_ptr + m * BLOCK_V
        tl.store(weights_row + offs, e)
        tl.debug_barrier()  # every thread's weights written before any thread reads another's
        below = (1.0 - top_p) * total
        token = _nucleus_race(weights_row, uniform_row, below, V, BLOCK_V, CANDIDATES)
        if token < 0:
            token = _draw(tl.load(weights_row + offs), uniform_row, total, top_p, V, BLOCK_V, TOP_P)
    else:
        token = _draw(e, uniform_row, total, top_p, V, BLOCK_V, TOP_P)
    _finish_step(token, m, pos, embed_ptr, hidden_ptr, tokens_ptr, out_ptr, pos_ptr, arrivals_ptr, M, out_stride,
                 first_position, H, BLOCK_H, ONE_ROW)


@triton.jit
def _draw(e, uniform_row, total, top_p, V: tl.constexpr, BLOCK_V: tl.constexpr, TOP_P: tl.constexpr):
    """The race over the weights e [BLOCK_V] (0 past the vocabulary), after top-p by bisection."""
    offs = tl.arange(0, BLOCK_V)
    valid = offs < V
    if TOP_P:
        below = (1.0 - top_p) * total
        lo = tl.zeros((), dtype=tl.int32)
        hi = tl.max(e.to(tl.int32, bitcast=True), axis=0)
        while lo < hi:  # the smallest weight whose mass at or below it exceeds 1 - p
            mid = (lo + hi) >> 1  # both below 2^30: weights are at most 1.0
            over = _mass_at_or_below(e, mid) > below
            hi = tl.where(over, mid, hi)
            lo = tl.where(over, lo, mid + 1)
        e = tl.where(e.to(tl.int32, bitcast=True) >= lo, e, 0.0)
        total = tl.sum(e, axis=0)
    p = tl.math.div_rn(e, total)  # the kept tokens' probabilities; 0 for the others
    u = tl.load(uniform_row + offs, mask=valid, other=0.5)
    race = tl.where(p > 0.0, tl.math.div_rn(p, -tl.log(tl.maximum(u, 1e-20))), -1.0)
    return tl.argmax(race, axis=0, tie_break_left=True)  # the first of equal maxima, as torch.argmax


@triton.jit
def _mass_at_or_below(e, bits):
    """sum(e <= w) for the weight w whose IEEE bits are `bits`: weights are >= 0, so their bits
    are in the same order as they are."""
    return tl.sum(tl.where(e.to(tl.int32, bitcast=True) <= bits, e, 0.0), axis=0)


@triton.jit
def _nucleus_race(weights_row, uniform_row, below, V: tl.constexpr, BLOCK_V: tl.constexpr, CANDIDATES: tl.constexpr):
    """The race's winner among the tokens of the nucleus, or -1 if none of its first CANDIDATES
    winners over the whole row is in the nucleus.

    The race over the whole row, `argmax(e / -log u)`, ranks every token; the race over the
    nucleus ranks its tokens in the same order (p = e / sum over the nucleus is e scaled), so its
    winner is the first token in the whole row's order that is in the nucleus. A token of weight w
    is in it when sum(e <= w) > below, the bisection's own test (`_mass_at_or_below`): one sum a
    candidate instead of up to 32. The candidates are taken in race order, the first of equal race
    values first, as `tl.argmax` breaks ties; each try recomputes the race from the stored weights
    and the draws, a quarter of the row at a time, so that no two arrays of the whole row are live
    in registers at once (they would spill inside the loop)."""
    offs = tl.arange(0, BLOCK_V)
    chunk: tl.constexpr = BLOCK_V // 4
    token = tl.full((), -1, dtype=tl.int32)
    last = tl.full((), float("inf"), dtype=tl.float32)  # the race value and index of the last candidate tried
    last_at = tl.full((), -1, dtype=tl.int32)
    tries = tl.zeros((), dtype=tl.int32)
    while (token < 0) & (tries < CANDIDATES):
        # the best race value after the last one tried, a quarter of the row at a time: the weights
        # and the draws of a whole row would not fit in registers together
        best = tl.full((), -3.0, dtype=tl.float32)
        best_at = tl.zeros((), dtype=tl.int32)
        for start in tl.static_range(0, BLOCK_V, chunk):
            at = start + tl.arange(0, chunk)
            w = tl.load(weights_row + at)
            u = tl.load(uniform_row + at, mask=at < V, other=0.5)
            race = tl.where(w > 0.0, tl.math.div_rn(w, -tl.log(tl.maximum(u, 1e-20))), -1.0)
            race = tl.where((race < last) | ((race == last) & (at > last_at)), race, -2.0)
            value, index = tl.max(race, axis=0, return_indices=True, return_indices_tie_break_left=True)
            better = value > best  # strict: of equal values the earlier quarter's, as tl.argmax
            best_at = tl.where(better, start + index, best_at)
            best = tl.where(better, value, best)
        last, last_at = best, best_at
        w_at = tl.load(weights_row + last_at)
        kept = (w_at > 0.0) & (_mass_at_or_below(tl.load(weights_row + offs), w_at.to(tl.int32, bitcast=True)) > below)
        token = tl.where(kept, last_at, -1)
        tries += 1
    return token


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


def thresholds(sampling: SamplingConfig, vocab: int) -> tuple[int, float]:
    """The sampling kernels' (top_k, top_p): 0 for no top-k, 1.0 for no top-p."""
    top_k = min(sampling.top_k, vocab) if sampling.top_k is not None else 0
    top_p = float(sampling.top_p) if sampling.top_p is not None and sampling.top_p < 1.0 else 1.0
    return top_k, top_p


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
    candidates: int = SAMPLE_CANDIDATES,
) -> None:
    """The end of a sampled decode step in one kernel, one program per row: the token that
    `inferlab.fast.engine.pick` draws from logits [M, V] (float32) with uniform [M, V] (temperature,
    top-k, top-p, then argmax(p / -log u)), then what `greedy_step` does with its token.

    `candidates`: with top-p, how many of the race's winners over the whole row are checked for
    the nucleus before its threshold is searched (0: searched at once).

    Exact up to float rounding: a logit whose mass at or below it lies within rounding of 1 - p,
    or two race values within an ulp, may go the other way than in the sorted torch step."""
    M, V = logits.shape
    H = embed.shape[1]
    if not sample_kernel_fits(V):
        raise ValueError(f"the sampling kernel holds at most {SAMPLE_MAX_VOCAB} logits a row, not {V}")
    if candidates < 0:
        raise ValueError(f"candidates must be 0 or more, not {candidates}")
    assert logits.dtype == torch.float32 and uniform.shape == logits.shape and uniform.dtype == torch.float32
    assert logits.is_contiguous() and uniform.is_contiguous() and embed.is_contiguous() and hidden.is_contiguous()
    assert out.stride(1) == 1
    top_k, top_p = thresholds(sampling, V)
    block = max(16, triton.next_power_of_2(V))  # the candidates' race takes a quarter of the row at a time
    dev = logits.device
    arrivals, = kept(("sample", dev), lambda: (torch.zeros(1, device=dev, dtype=torch.int32),))
    weights, = kept(("sample-weights", dev, M, block),
                    lambda: (torch.empty(M, block, device=dev, dtype=torch.float32),))
    _sample_step_kernel[(M,)](
        logits, uniform, embed, hidden, tokens, out, position, arrivals, weights, M, out.stride(0), first_position,
        float(sampling.temperature), top_p, top_k,
        V=V, H=H, BLOCK_V=block, BLOCK_H=1024, TEMPERATURE=sampling.temperature != 1.0, TOP_K=top_k > 0,
        TOP_P=top_p < 1.0, ONE_ROW=M == 1, CANDIDATES=candidates if top_p < 1.0 else 0,
        num_warps=sample_warps(block),
    )
