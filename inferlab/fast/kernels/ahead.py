"""The next kernel's weights asked of L2 while this kernel runs (`LaunchPolicy(l2_ahead=bytes)`).

Between two kernels of a decode step the memory bus idles: the next kernel's programs wait for
room on the SMs and for the previous kernel's results before most of their weight reads begin,
and the attention kernel between [q; k; v] and o reads a few KB of cache while the bus has
nothing to do. Weights are never written, so a kernel may ask L2 for the weights of a kernel
after it at any time: `cp.async.bulk.prefetch.L2.global`, one request per contiguous chunk, a
hint that returns at once. That kernel's loads then find the first bytes of its matrix on chip.

`AheadPlan` cuts the first bytes of the next weight (of each half of a [gate; up] matrix, whose
programs read the two halves side by side) between a kernel's programs and threads; `_warm_l2` is
one program's share. No result depends on it, and under Triton's interpreter, which has no inline
assembly, it does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MIN_CHUNK = 256  # bytes a request at least: larger shares take larger chunks, not more requests
ALIGN = 16  # a bulk request's address and size are multiples of 16 bytes
ALIGN_BYTES: tl.constexpr = tl.constexpr(ALIGN)


@dataclass(frozen=True)
class AheadPlan:
    """`slots` programs ask for `parts` regions of `part_bytes` bytes each, `part_stride` bytes
    apart, in requests of `chunk` bytes, `threads` requests a program: slot s takes region
    s % parts, requests (s // parts) * threads ... + threads - 1 of it."""

    part_bytes: int
    part_stride: int
    parts: int
    chunk: int
    threads: int
    slots: int


NO_PLAN = AheadPlan(part_bytes=0, part_stride=0, parts=1, chunk=ALIGN, threads=1, slots=0)


def ahead_plan(weight: torch.Tensor | None, limit: int, programs: int, threads: int, gated: bool = False) -> AheadPlan:
    """How `programs` programs of `threads` threads each ask L2 for the first `limit` bytes of
    `weight` (a [gate; up] weight, `gated`: the first `limit` / 2 of each half), in as few programs
    as take it in chunks of at least MIN_CHUNK bytes. No weight, no limit: no requests."""
    if weight is None or limit <= 0 or programs <= 0:
        return NO_PLAN
    assert weight.is_contiguous(), "a weight read ahead is one contiguous block"
    parts = 2 if gated else 1
    stride = weight.numel() * weight.element_size() // parts
    part_bytes = min(stride, limit // parts) // ALIGN * ALIGN
    if part_bytes == 0:
        return NO_PLAN
    per_program = -(-parts * part_bytes // programs)
    chunk = max(MIN_CHUNK, -(-per_program // threads))
    chunk = -(-chunk // ALIGN) * ALIGN
    slots = parts * -(-part_bytes // (chunk * threads))
    return AheadPlan(part_bytes, stride, parts, chunk, threads, slots)


def ahead_operands(weight: torch.Tensor | None, plan: AheadPlan, fallback: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The kernel's pointer (a byte view of the weight; with no requests, `fallback` as it is: the
    kernel never reads it) and its constexprs."""
    pointer = weight.view(-1).view(torch.uint8) if plan.slots else fallback
    return pointer, dict(AHEAD_SLOTS=plan.slots, AHEAD_PARTS=plan.parts, AHEAD_BYTES=plan.part_bytes,
                         AHEAD_STRIDE=plan.part_stride, AHEAD_CHUNK=plan.chunk, AHEAD_THREADS=plan.threads)


def plan_requests(plan: AheadPlan, slot: int) -> list[tuple[int, int]]:
    """(byte offset, size) of each request slot `slot` makes, in Python: what `_warm_l2` asks for."""
    if slot >= plan.slots:
        return []
    part, share = slot % plan.parts, slot // plan.parts
    requests = []
    for thread in range(plan.threads):
        start = (share * plan.threads + thread) * plan.chunk
        size = min(plan.chunk, plan.part_bytes - start)
        if size > 0:
            requests.append((part * plan.part_stride + start, size))
    return requests


@triton.jit
def _ahead_requests(slot, PARTS: tl.constexpr, BYTES: tl.constexpr, STRIDE: tl.constexpr, CHUNK: tl.constexpr,
                    THREADS: tl.constexpr):
    """Slot `slot`'s requests, one a thread: (byte offsets into the weight, sizes), [THREADS] each;
    a size <= 0 asks nothing (its offset is kept inside the region)."""
    part = slot % PARTS
    start = ((slot // PARTS) * THREADS + tl.arange(0, THREADS)) * CHUNK
    size = tl.minimum(BYTES - start, CHUNK)
    offset = part.to(tl.int64) * STRIDE + tl.minimum(start, BYTES - ALIGN_BYTES).to(tl.int64)
    return offset, size.to(tl.int32)


@triton.jit
def _warm_l2(ahead_ptr, slot, SLOTS: tl.constexpr, PARTS: tl.constexpr, BYTES: tl.constexpr, STRIDE: tl.constexpr,
             CHUNK: tl.constexpr, THREADS: tl.constexpr, INTERPRETED: tl.constexpr):
    """Slot `slot`'s requests of an `AheadPlan` (`plan_requests`), one a thread, as bulk prefetches
    to L2: ahead_ptr is the next weight's bytes (uint8). A slot from SLOTS on asks nothing."""
    if SLOTS > 0 and not INTERPRETED:
        if slot < SLOTS:
            offset, size = _ahead_requests(slot, PARTS, BYTES, STRIDE, CHUNK, THREADS)
            tl.inline_asm_elementwise(
                "{\n\t.reg .pred p;\n\tsetp.gt.s32 p, $2, 0;\n\t@p cp.async.bulk.prefetch.L2.global [$1], $2;\n\t"
                "mov.u32 $0, 0;\n\t}", "=r,l,r", [ahead_ptr + offset, size], dtype=tl.int32, is_pure=False, pack=1)
