"""The next kernel's weights asked of L2 (`LaunchPolicy(l2_ahead=bytes)`, `inferlab.fast.kernels.ahead`):
the plan covers exactly the bytes asked for, inside the weight, the kernels' own arithmetic asks for
what the plan says, and no result changes (on a GPU the requests run; under the interpreter they
are skipped)."""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (requirements/test.txt installs it)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from inferlab.fast import spec as decode_ops  # noqa: E402
from inferlab.fast.kernels import ahead  # noqa: E402
from inferlab.fast.kernels.ahead import _ahead_requests  # noqa: E402

from test_triton_ops import DEVICE, DTYPES, draw  # noqa: E402


def covered(plan: ahead.AheadPlan) -> list[tuple[int, int]]:
    """Every slot's requests, sorted: (offset, size)."""
    return sorted(r for slot in range(plan.slots) for r in ahead.plan_requests(plan, slot))


@pytest.mark.parametrize("shape, gated, limit, programs, threads", [
    ((2048, 2048), False, 8 << 20, 64, 128),     # o's weight (8 MB) asked by the attention's 64 programs
    ((11264, 2048), True, 8 << 20, 1024, 128),   # [gate; up]: 4 MB of each half, by o's 1024 programs
    ((2048, 5632), False, 8 << 20, 88, 128),     # down by [gate; up]'s 88 TMA programs: large chunks
    ((64, 40), False, 1 << 30, 7, 32),           # a limit past the weight: the whole weight, 5120 bytes
    ((24, 8), True, 100, 3, 32),                 # 50 bytes a half, rounded down to 48
])
def test_the_plan_asks_for_the_first_bytes_of_each_part_once_inside_the_weight(shape, gated, limit, programs,
                                                                               threads):
    weight = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    plan = ahead.ahead_plan(weight, limit, programs, threads, gated)
    parts = 2 if gated else 1
    total = weight.numel() * 2
    wanted = min(total // parts, limit // parts) // 16 * 16
    assert plan.part_bytes == wanted and plan.parts == parts and plan.part_stride == total // parts
    assert 0 < plan.slots <= max(programs, parts) and plan.chunk % 16 == 0 and plan.chunk >= ahead.MIN_CHUNK
    expected = [(part * (total // parts), wanted) for part in range(parts)]
    merged = []  # the requests, contiguous and without overlap, merged into runs
    for offset, size in covered(plan):
        assert offset % 16 == 0 and size % 16 == 0 and size > 0 and offset + size <= total
        if merged and merged[-1][0] + merged[-1][1] == offset:
            merged[-1] = (merged[-1][0], merged[-1][1] + size)
        else:
            merged.append((offset, size))
    assert merged == expected


def test_no_weight_no_limit_or_too_few_bytes_plan_nothing():
    weight = torch.empty(64, 64, dtype=torch.bfloat16, device="meta")
    for plan in (ahead.ahead_plan(None, 1 << 20, 8, 128), ahead.ahead_plan(weight, 0, 8, 128),
                 ahead.ahead_plan(weight, 15, 8, 128)):
        assert plan == ahead.NO_PLAN and covered(plan) == []


@triton.jit
def _requests_of(offset_ptr, size_ptr, PARTS: tl.constexpr, BYTES: tl.constexpr, STRIDE: tl.constexpr,
                 CHUNK: tl.constexpr, THREADS: tl.constexpr):
    slot = tl.program_id(0)
    offset, size = _ahead_requests(slot, PARTS, BYTES, STRIDE, CHUNK, THREADS)
    at = slot * THREADS + tl.arange(0, THREADS)
    tl.store(offset_ptr + at, offset)
    tl.store(size_ptr + at, size)


@pytest.mark.parametrize("shape, gated, limit, programs", [((2048, 2048), False, 1 << 20, 64),
                                                           ((1024, 512), True, 300_000, 40)])
def test_the_kernels_requests_are_the_plans(shape, gated, limit, programs):
    """`_ahead_requests`, the arithmetic `_warm_l2` hands the bulk prefetch, run for every slot:
    the requests of positive size are `plan_requests`'."""
    weight = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    plan = ahead.ahead_plan(weight, limit, programs, 32, gated)
    offsets = torch.zeros(plan.slots * 32, dtype=torch.int64, device=DEVICE)
    sizes = torch.zeros(plan.slots * 32, dtype=torch.int32, device=DEVICE)
    _requests_of[(plan.slots,)](offsets, sizes, PARTS=plan.parts, BYTES=plan.part_bytes, STRIDE=plan.part_stride,
                                CHUNK=plan.chunk, THREADS=32)
    asked = sorted((int(o), int(s)) for o, s in zip(offsets.cpu(), sizes.cpu()) if s > 0)
    assert asked == covered(plan)
    total = weight.numel() * 2
    assert int(offsets.min()) >= 0 and int(offsets.max()) < total  # even a request of no size points inside


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M, batched", [(1, "tma"), (5, "tma")])  # the one-row kernel; the TMA kernel
@pytest.mark.parametrize("gated", [False, True])
def test_a_projection_asking_for_the_next_weight_computes_the_same_bits(dtype, M, batched, gated):
    from inferlab.fast import kernels

    x, norm = draw(M, 128, dtype=dtype, seed=1), draw(128, dtype=dtype, seed=2)
    weight = draw(96 if gated else 48, 128, dtype=dtype, seed=3, scale=0.1)
    after = draw(64, 96, dtype=dtype, seed=4)  # the next matrix: 12 KB in bf16, asked for whole
    config = kernels.LaunchConfig(block_n=16, block_k=32, num_warps=4, num_stages=2)
    base = kernels.LaunchPolicy(rows_min_batch=4, batched=batched)
    plain = kernels.gemv(x, weight, norm=norm, eps=1e-5, gated=gated, config=config, policy=base)
    asked = kernels.gemv(x, weight, norm=norm, eps=1e-5, gated=gated, config=config, ahead=after, ahead_gated=True,
                         policy=kernels.LaunchPolicy(rows_min_batch=4, batched=batched, l2_ahead=1 << 20))
    assert torch.equal(plain, asked) and plain.abs().max() > 0
    expected = decode_ops.gemv(x, weight, norm=norm, eps=1e-5, gated=gated)
    error = (asked.float() - expected.float()).norm() / expected.float().norm()
    assert error < (1e-5 if dtype == torch.float32 else 2**-7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_attention_asking_for_o_computes_the_same_bits_and_cache(dtype):
    from inferlab.fast import kernels

    heads, kv_heads, hd, cache = 4, 2, 16, 256
    qkv = draw(1, (heads + 2 * kv_heads) * hd, dtype=dtype, seed=1)
    cos, sin = draw(cache, hd, dtype=dtype, seed=2), draw(cache, hd, dtype=dtype, seed=3)
    wo = draw(heads * hd, heads * hd, dtype=dtype, seed=4)
    position = torch.tensor([200], device=DEVICE)
    results = []
    for limit in (0, 1 << 20):
        k, v = draw(1, kv_heads, cache, hd, dtype=dtype, seed=5), draw(1, kv_heads, cache, hd, dtype=dtype, seed=6)
        ops = kernels.Kernels(policy=kernels.LaunchPolicy(head_block_t=32, head_range=64, head_whole_cache=0, l2_ahead=limit))
        results.append((ops.attention_decode(qkv, cos, sin, position, k, v, heads, kv_heads, ahead=wo), k, v))
    (plain, k0, v0), (asked, k1, v1) = results
    assert torch.equal(plain, asked) and torch.equal(k0, k1) and torch.equal(v0, v1)


def test_the_engine_passes_each_kernel_the_weight_after_it(tiny, monkeypatch):
    """In a decode step, attention asks for o's weight, o for [gate; up] (gated), [gate; up] for
    down, down for the next layer's [q; k; v] (the last layer's for the LM head) and the LM head for
    the first layer's [q; k; v]; with l2_ahead_from="attention" only the attention asks."""
    from inferlab.fast import kernels
    from inferlab.fast.engine import FastLlama

    net = FastLlama(tiny.model)
    layers = list(net.layers)
    order = []
    for index, layer in enumerate(layers):
        after = layers[index + 1].wqkv if index + 1 < len(layers) else net.lm_head
        order += [(layer.wqkv, None, False), ("attention", layer.wo, False), (layer.wo, layer.w13, True),
                  (layer.w13, layer.w2, False), (layer.w2, after, False)]
    order.append((net.lm_head, layers[0].wqkv, False))

    def named(calls):
        return [(w if isinstance(w, str) else id(w), None if a is None else id(a), g) for w, a, g in calls]

    for source in ("all", "attention"):
        asked = []

        def gemv(x, w, ahead=None, ahead_gated=False, pdl=None, policy=None, **kw):
            asked.append((w, ahead, ahead_gated if ahead is not None else False))
            return decode_ops.gemv(x, w, **kw)

        def attention(*operands, ahead=None, **kw):
            asked.append(("attention", ahead, False))
            return decode_ops.attention_decode(*operands)

        monkeypatch.setattr(kernels, "gemv", gemv)
        monkeypatch.setattr(kernels, "attention_decode", attention)
        ops = kernels.Kernels(policy=kernels.LaunchPolicy(l2_ahead=1 << 20, l2_ahead_from=source))
        net.decode(torch.zeros(1, 1, dtype=torch.long), torch.tensor([3]), net.new_cache(1, 16), ops)
        wanted = order if source == "all" else [(w, a if w == "attention" else None, False) for w, a, _ in order]
        assert named(asked) == named(wanted)
