"""The fused decode operations: the torch specification (`decode_ops`) gives transformers' logits,
and the Triton kernels (`triton_ops`) compute the same function, including the cache write,
masked edges and several rows. On a CPU the kernels run under Triton's interpreter (fp32 only:
it rounds to bf16 by truncation); on CUDA they are compiled, and bf16 is checked too."""

import functools

import pytest
import torch
import torch.nn.functional as F

from inferlab.fast import spec as decode_ops
from inferlab.decode.loop import DecodeConfig, generate
from inferlab.fast.engine import FastEngine, FastLlama, FastOptions
from inferlab.decode.prompts import random_prompt
from inferlab.measure.clocks import HostClock

pytest.importorskip("triton", reason="Triton is not installed (requirements/test.txt installs it)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from inferlab.fast.kernels.tma import _l2_lines  # noqa: E402


@triton.jit
def _prefetched_lines(out_ptr, n0, k_first, ROWS: tl.constexpr, K: tl.constexpr):
    """`_l2_lines`'s offsets for 16 rows x 64 columns in lines of 32, stored [16, 2]."""
    offsets = _l2_lines(n0, k_first, ROWS, K, 16, 64, 32)
    tl.store(out_ptr + tl.arange(0, 16)[:, None] * 2 + tl.arange(0, 2)[None, :], offsets)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def kernels():
    from inferlab.fast import kernels as triton_ops

    return triton_ops


def draw(*shape, dtype=torch.float32, seed=0, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE, dtype)


def assert_same_function(ours: torch.Tensor, expected: torch.Tensor) -> None:
    """fp32: the same sums in another order, equal to 1e-5. bf16: the float32 sums differ in their
    last bits, so a rounded intermediate (a normalized input, an output) can land on the
    neighbouring bf16 value, a relative step of 2^-8; the whole result must stay within
    ||ours - expected|| / ||expected|| < 2^-7 (a wrong index or a missing term is far above that)."""
    assert ours.shape == expected.shape and ours.dtype == expected.dtype
    if expected.dtype == torch.float32:
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    else:
        error = (ours.float() - expected.float()).norm() / expected.float().norm()
        assert error < 2**-7, f"relative error {error:.2e}"


# (N, K) with tiles of 8 (or 16) rows x 64 columns: masked edges (N = 40, K = 96 are not
# multiples), unmasked loads over two K tiles, and a single tile (the loop after the first tile
# is empty).
SHAPES = {"masked": (40, 96), "two-tiles": (32, 128), "one-tile": (16, 64)}


def gemv_case(M: int, shape: str, variant: str, dtype) -> tuple:
    """x [M, K], the weight ([2N, K] when gated) and the keywords of one `gemv` variant, seeded."""
    N, K = SHAPES[shape]
    x, norm, residual = draw(M, K, dtype=dtype, seed=1), draw(K, dtype=dtype, seed=2), draw(M, N, dtype=dtype, seed=3)
    weight = draw(2 * N if variant == "gated" else N, K, dtype=dtype, seed=4, scale=0.1)
    kwargs = {
        "plain": {},
        "norm": dict(norm=norm, eps=1e-5),
        "residual": dict(residual=residual),
        "gated": dict(norm=norm, eps=1e-5, gated=True),
        "logits": dict(norm=norm, eps=1e-5, out_dtype=torch.float32),
    }[variant]
    return x, weight, kwargs


def dtype_variants(variants: list[str]) -> list:
    """(dtype, variant) pairs for `gemv_case`, bf16 on CUDA only. "logits" (a float32 output) runs
    in bf16 alone: from float32 inputs it is "norm" exactly (the same operands, kernel flags and
    output dtype, so the same launch and the same bits)."""
    pairs = []
    for variant in variants:
        if variant != "logits":
            pairs.append(pytest.param(torch.float32, variant, id=f"{variant}-fp32"))
        pairs.append(pytest.param(torch.bfloat16, variant, marks=pytest.mark.gpu, id=f"{variant}-bf16"))
    return pairs


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, variant", dtype_variants(["plain", "norm", "residual", "gated", "logits"]))
# one row; a few rows, one program each; the tensor-core kernel with masked rows; two blocks of 16 rows
@pytest.mark.parametrize("M", [1, 3, 5, 17])
def test_gemv_kernel_computes_the_specified_function(kernels, dtype, shape, variant, M):
    N = SHAPES[shape][0]
    x, weight, kwargs = gemv_case(M, shape, variant, dtype)
    # one program per row: tiles of 8 x 64; the tensor-core kernel: tiles at least 16 wide
    config = kernels.LaunchConfig(block_n=8 if M < kernels.DEFAULT_POLICY.rows_min_batch else 16, block_k=64, num_warps=4, num_stages=1)
    ours = kernels.gemv(x, weight, config=config, **kwargs)
    expected = decode_ops.gemv(x, weight, **kwargs)
    assert ours.shape == (M, N)
    assert_same_function(ours, expected)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, variant", dtype_variants(["plain", "norm", "residual", "gated", "logits"]))
@pytest.mark.parametrize("M", [1, 3])
# tiles of 64 columns: two tiles (masked when K = 96) or exactly one (K = 64); 128: one tile, wider
# than K = 96 and 64 (masked) or exactly K = 128, where the input is read once for norm and products
@pytest.mark.parametrize("block_k", [64, 128])
def test_the_one_row_kernel_with_early_loads_computes_what_it_computes_without(kernels, dtype, shape, variant, M,
                                                                               block_k):
    """`LaunchPolicy(early_loads=True)` moves loads, not arithmetic: the same bits as the kernel
    without it, and the specified function."""
    x, weight, kwargs = gemv_case(M, shape, variant, dtype)
    config = kernels.LaunchConfig(block_n=8, block_k=block_k, num_warps=4, num_stages=1)
    early = kernels.gemv(x, weight, config=config, policy=kernels.LaunchPolicy(early_loads=True), **kwargs)
    late = kernels.gemv(x, weight, config=config, policy=kernels.LaunchPolicy(early_loads=False), **kwargs)
    assert torch.equal(early, late)
    assert_same_function(early, decode_ops.gemv(x, weight, **kwargs))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, variant", dtype_variants(["norm", "gated", "logits"]))
# the CUDA-core kernel at 2, 3 (padded to 4) and 8 rows; the tensor-core kernel at 5 rows (a tile of
# 16 holding 8 that can exist) and 17 (two tiles, the second with one row)
@pytest.mark.parametrize("M, batched", [(2, "cuda"), (3, "cuda"), (8, "cuda"), (5, "tensor"), (17, "tensor")])
@pytest.mark.parametrize("columns", [8192, 64])  # the whole K in one tile; K in tiles of 4-16 columns
def test_the_batched_kernels_with_a_wide_rms_pass_compute_the_specified_function(kernels, dtype, shape, variant, M,
                                                                                  batched, columns, monkeypatch):
    monkeypatch.setattr(kernels.projections, "rms_columns", lambda rows, k: min(1 << (k - 1).bit_length(), max(4, columns // rows)))
    x, weight, kwargs = gemv_case(M, shape, variant, dtype)
    block = (4, 32) if batched == "cuda" else (16, 64)
    config = kernels.LaunchConfig(block_n=block[0], block_k=block[1], num_warps=4, num_stages=1)
    policy = kernels.LaunchPolicy(batched=batched, rows_min_batch=2, wide_rms=True)
    ours = kernels.gemv(x, weight, config=config, policy=policy, **kwargs)
    assert_same_function(ours, decode_ops.gemv(x, weight, **kwargs))


@pytest.mark.parametrize("rows, k, columns", [(4, 2048, 2048), (16, 2048, 512), (8, 576, 1024), (2, 5632, 4096),
                                              (1024, 64, 16)])
def test_the_wide_rms_pass_reads_8192_values_a_tile_at_most_k_columns(kernels, rows, k, columns):
    assert kernels.rms_columns(rows, k) == columns


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["plain", "residual", "gated"])
@pytest.mark.parametrize("M", [2, 3])
def test_the_cuda_core_batch_kernel_with_early_loads_computes_what_it_computes_without(kernels, dtype, shape, variant,
                                                                                       M):
    x, weight, kwargs = gemv_case(M, shape, variant, dtype)
    config = kernels.LaunchConfig(block_n=4, block_k=32, num_warps=4, num_stages=1)
    policy = kernels.LaunchPolicy(batched="cuda", early_loads=False)
    early = kernels.gemv(x, weight, config=config, policy=kernels.LaunchPolicy(batched="cuda", early_loads=True),
                         **kwargs)
    assert torch.equal(early, kernels.gemv(x, weight, config=config, policy=policy, **kwargs))
    assert_same_function(early, decode_ops.gemv(x, weight, **kwargs))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, variant", dtype_variants(["plain", "norm", "residual", "gated", "logits"]))
@pytest.mark.parametrize("M", [2, 3, 8])  # a power of two of rows; 3 rows padded to 4 (masked)
@pytest.mark.parametrize("block_k", [32, None])  # several K tiles (masked when K = 96); the default shape
def test_the_cuda_core_batch_kernel_computes_the_specified_function(kernels, dtype, shape, variant, M, block_k):
    N = SHAPES[shape][0]
    x, weight, kwargs = gemv_case(M, shape, variant, dtype)
    config = kernels.LaunchConfig(block_n=4, block_k=block_k, num_warps=4, num_stages=1) if block_k else None
    policy = kernels.LaunchPolicy(batched="cuda")
    ours = kernels.gemv(x, weight, config=config, policy=policy, **kwargs)
    assert ours.shape == (M, N)
    assert_same_function(ours, decode_ops.gemv(x, weight, **kwargs))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, variant", dtype_variants(["plain", "norm", "residual", "gated", "logits"]))
@pytest.mark.parametrize("M", [2, 3, 8])  # 3 rows padded to 4 (the fourth reads row 3, never stored)
@pytest.mark.parametrize("early", [False, True])
def test_the_rowwise_batch_kernel_computes_the_specified_function(kernels, dtype, shape, variant, M, early):
    """`LaunchPolicy(batched="rowwise")`: each weight tile into one row at a time, in the one-row
    kernel's launch shape (here the policy's default shape: 8 rows x 64, one or two K tiles)."""
    N = SHAPES[shape][0]
    x, weight, kwargs = gemv_case(M, shape, variant, dtype)
    policy = kernels.LaunchPolicy(batched="rowwise", default_gemv=kernels.LaunchConfig(8, 64, 4, 1), early_loads=early)
    ours = kernels.gemv(x, weight, policy=policy, **kwargs)
    assert ours.shape == (M, N)
    assert_same_function(ours, decode_ops.gemv(x, weight, **kwargs))


def test_the_rowwise_policy_runs_from_two_rows_to_its_limit(kernels, record_launches):
    launched = record_launches(("_gemv_kernel", "_gemv_rows_kernel", "_gemv_batch_kernel"))
    weight = draw(16, 64, seed=4, scale=0.1)
    one_row = kernels.LaunchConfig(8, 64, 4, 1)
    policy = kernels.LaunchPolicy(batched="rowwise", rowwise_max_rows=4, default_gemv=one_row,
                                  rows_gemv=kernels.LaunchConfig(16, 64, 4, 1))
    for M in (1, 2, 4, 5):
        x = draw(M, 64, seed=M)
        assert_same_function(kernels.Kernels(pdl=False, policy=policy).gemv(x, weight), decode_ops.gemv(x, weight))
    assert launched == ["_gemv_kernel", "_gemv_batch_kernel", "_gemv_batch_kernel", "_gemv_rows_kernel"]
    assert policy.rows_launch(16, 64, False, 4) == kernels.RowsLaunch("rowwise")
    assert policy.max_rows("rowwise") == 4 and policy.max_rows("tensor") > 1 << 30
    with pytest.raises(ValueError, match="'rowwise'"):
        kernels.LaunchPolicy(batched="row-wise")


@pytest.mark.parametrize("rows, gated, block_k", [(2, False, 512), (4, True, 128), (8, False, 128), (8, True, 64)])
def test_the_batch_kernel_keeps_its_products_within_4096_floats(kernels, rows, gated, block_k):
    config = kernels.batch_config(rows, gated)
    assert (config.block_n, config.block_k) == (4, block_k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["masked", "two-tiles"])
@pytest.mark.parametrize("variant", ["norm", "residual", "gated"])
@pytest.mark.parametrize("target", [64, 10_000])  # K cut in 2 or 4 ranges (uneven when masked: 3 tiles in 2)
def test_the_tensor_core_kernel_split_over_k_computes_the_specified_function_launch_after_launch(
        kernels, dtype, shape, variant, target):
    N, K = SHAPES[shape]
    M = 5
    x, norm, residual = draw(M, K, dtype=dtype, seed=1), draw(K, dtype=dtype, seed=2), draw(M, N, dtype=dtype, seed=3)
    weight = draw(2 * N if variant == "gated" else N, K, dtype=dtype, seed=4, scale=0.1)
    kwargs = {"norm": dict(norm=norm, eps=1e-5), "residual": dict(residual=residual),
              "gated": dict(norm=norm, eps=1e-5, gated=True)}[variant]
    config = kernels.LaunchConfig(block_n=16, block_k=32, num_warps=4, num_stages=1)
    policy = kernels.LaunchPolicy(batched="tensor", rows_min_batch=2, rows_target_programs=target)
    n_tiles = -(-N // 16)
    assert kernels.rows_split_k(n_tiles, -(-K // 32), target) > 1
    for launch in range(2):  # the second launch finds the arrival counts reset by the first
        ours = kernels.gemv(x, weight, config=config, policy=policy, **kwargs)
        assert_same_function(ours, decode_ops.gemv(x, weight, **kwargs))
        x = x.roll(1, dims=0)
    counts = [buffers[1] for key, buffers in kernels.KEPT.items() if key[0] == "split-k"]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["plain", "norm", "gated", "residual"])
@pytest.mark.parametrize("target", [0, 10_000])  # K whole; K cut into ranges, each prefetching its own first tile
def test_the_tensor_core_kernel_with_its_first_tile_loaded_early_computes_the_specified_function(
        kernels, dtype, shape, variant, target):
    """`rows_prefetch`: the first weight tile is loaded before the wait, multiplied after; with one
    K tile the loop after it is empty, with a masked K the prefetched tile is masked too."""
    M = 5
    x, weight, kwargs = gemv_case(M, shape, variant, dtype)
    config = kernels.LaunchConfig(block_n=16, block_k=32, num_warps=4, num_stages=1)
    policy = kernels.LaunchPolicy(batched="tensor", rows_min_batch=2, rows_target_programs=target, rows_prefetch=True)
    ours = kernels.gemv(x, weight, config=config, policy=policy, **kwargs)
    assert_same_function(ours, decode_ops.gemv(x, weight, **kwargs))


def assert_launch_after_launch(kernels, launch, policy: dict, shape: str, variant: str, dtype) -> None:
    """`launch` (a `RowsLaunch`, in a policy of `policy`'s fields, from 2 rows) at 5 rows (a tile of
    16 holding 5) and 17 (two row tiles, the second with one row), twice each on other rows: the
    specification's function on every launch."""
    N, K = SHAPES[shape]
    for M in (5, 17):
        x, weight, kwargs = gemv_case(M, shape, variant, dtype)
        rows = {(N, K, variant == "gated", min(1 << (M - 1).bit_length(), 16)): launch}
        run = kernels.LaunchPolicy(rows_min_batch=2, rows=rows, **policy)
        assert run.rows_launch(N, K, variant == "gated", M) == launch
        for launch_index in range(2):
            ours = kernels.gemv(x, weight, policy=run, **kwargs)
            assert ours.shape == (M, N)
            assert_same_function(ours, decode_ops.gemv(x, weight, **kwargs))
            x = x.roll(1, dims=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_matrix_launch_asks_l2_for_its_own_tiles_before_the_wait(kernels, monkeypatch, dtype):
    """`RowsLaunch("tma", l2_tiles=n)`: that matrix's programs ask L2 for their first n weight
    tiles before the wait (at least the policy's `tma_prefetch`), the others as the policy says;
    the function is the specification's."""
    from inferlab.fast.kernels import projections

    asked = []
    real = projections.gemv_tma
    monkeypatch.setattr(projections, "gemv_tma", lambda *args, **kwargs: asked.append(args[7]) or real(*args, **kwargs))
    config = kernels.LaunchConfig(block_n=16, block_k=32, num_warps=4, num_stages=2)
    N, K = SHAPES["two-tiles"]
    x, weight, kwargs = gemv_case(5, "two-tiles", "norm", dtype)
    for launch, policy, tiles in ((kernels.RowsLaunch("tma", config, l2_tiles=2), {}, 2),
                                  (kernels.RowsLaunch("tma", config), {}, 0),
                                  (kernels.RowsLaunch("tma", config, l2_tiles=1), {"tma_prefetch": 2}, 2)):
        run = kernels.LaunchPolicy(rows={(N, K, False, 8): launch}, **policy)
        assert_same_function(kernels.gemv(x, weight, policy=run, **kwargs), decode_ops.gemv(x, weight, **kwargs))
        assert asked.pop() == tiles
    with pytest.raises(ValueError, match="RowsLaunch l2_tiles must be 0 or more weight tiles, not -1"):
        kernels.RowsLaunch("tma", l2_tiles=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["plain", "norm", "residual", "gated", "logits"])
# one program (every tile whole); 7 (tiles cut between programs, one program holding the end of one
# tile and the start of the next), also with the first unit's weights loaded before the wait; more
# programs than units (capped: a unit each)
@pytest.mark.parametrize("programs, prefetch", [(1, False), (7, False), (7, True), (1000, False)])
@pytest.mark.parametrize("tma", [False, True])  # the weight tiles through a TMA descriptor
def test_the_stream_k_kernel_computes_the_specified_function_launch_after_launch(kernels, dtype, shape, variant,
                                                                                 programs, prefetch, tma):
    """`_gemv_stream_kernel` at 5 rows (a tile of 16 holding 5) and 17 (two row tiles, the second
    with one row): the specification's function on every launch (the first leaves every arrival
    count at 0 for the second), whatever the programs' cut."""
    if variant == "logits" and dtype == torch.float32:
        pytest.skip("logits from float32 inputs are 'norm' exactly (dtype_variants)")
    config = kernels.LaunchConfig(block_n=16, block_k=32, num_warps=4, num_stages=2)
    launch = kernels.RowsLaunch("stream", config, target_programs=programs, prefetch=prefetch)
    assert_launch_after_launch(kernels, launch, {"stream_tma": tma}, shape, variant, dtype)
    counts = [buffers[1] for key, buffers in kernels.KEPT.items() if key[0] == "stream-k"]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)


@pytest.mark.parametrize("n_tiles, k_tiles", [(1, 1), (1, 7), (5, 3), (88, 16), (500, 16), (32, 44)])
@pytest.mark.parametrize("programs", [1, 2, 3, 7, 132, 264])
def test_stream_k_ranges_cover_every_unit_once_and_its_slots_fit(kernels, n_tiles, k_tiles, programs):
    """Program p takes units p * U // P up to (p + 1) * U // P; `stream_owner` finds the program of a
    unit, and `stream_slots` is the most programs any tile is cut between (each needs a slot)."""
    from inferlab.fast.kernels.stream import stream_owner, stream_slots

    units = n_tiles * k_tiles
    programs = min(programs, units)
    ranges = [range(p * units // programs, (p + 1) * units // programs) for p in range(programs)]
    assert sorted(u for r in ranges for u in r) == list(range(units))
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1
    assert all(stream_owner(u, units, programs) == p for p, r in enumerate(ranges) for u in r)
    sharing = [len({p for p, r in enumerate(ranges) for u in r if u // k_tiles == t}) for t in range(n_tiles)]
    assert stream_slots(n_tiles, k_tiles, programs) == max(sharing)


def test_the_stream_policy_runs_the_stream_k_kernel_from_its_switch(kernels, record_launches):
    launched = record_launches(("_gemv_kernel", "_gemv_rows_kernel", "_gemv_stream_kernel"))
    weight = draw(32, 64, seed=4, scale=0.1)
    policy = kernels.LaunchPolicy(batched="stream", rows={}, default_gemv=kernels.LaunchConfig(8, 64, 4, 1),
                                  stream_gemv=kernels.LaunchConfig(16, 32, 4, 1))
    for M in (1, 3, 4, 16):
        x = draw(M, 64, seed=M)
        assert_same_function(kernels.Kernels(pdl=False, policy=policy).gemv(x, weight), decode_ops.gemv(x, weight))
    assert launched == ["_gemv_kernel", "_gemv_kernel", "_gemv_stream_kernel", "_gemv_stream_kernel"]
    assert policy.rows_launch(32, 64, False, 4) == kernels.RowsLaunch("stream", kernels.LaunchConfig(16, 32, 4, 1))
    with pytest.raises(ValueError, match="stream_per_sm"):
        kernels.LaunchPolicy(stream_per_sm=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("variant", ["plain", "norm", "residual", "gated", "logits"])
# K whole (one program a tile); 2 ranges; as many as the policy's programs per SM give; more than K has tiles
@pytest.mark.parametrize("target", [1, 6, 0, 1000])
# the first 2 tiles of each program asked of L2 before the wait; and with its first tile copied
# into shared memory before the wait too
@pytest.mark.parametrize("prefetch, early", [(0, False), (2, False), (2, True)], ids=["0", "2", "2-early"])
def test_the_tma_kernel_computes_the_specified_function_launch_after_launch(kernels, dtype, shape, variant, target,
                                                                            prefetch, early):
    """`_gemv_tma_kernel` at 5 rows (a tile of 16 holding 5) and 17 (two row tiles, the second with
    one row), its weight tiles read through a TMA descriptor (zeros past the matrix's edge): the
    specification's function on every launch (the first leaves every arrival count at 0 for the
    second), whatever the cut of K."""
    if variant == "logits" and dtype == torch.float32:
        pytest.skip("logits from float32 inputs are 'norm' exactly (dtype_variants)")
    config = kernels.LaunchConfig(block_n=16, block_k=32, num_warps=4, num_stages=2)
    launch = kernels.RowsLaunch("tma", config, target_programs=target)
    assert_launch_after_launch(kernels, launch, {"tma_prefetch": prefetch, "tma_early": early}, shape, variant, dtype)
    from inferlab.fast.kernels.tma import tma_split_k

    N, K = SHAPES[shape]
    programs = target or kernels.DEFAULT_POLICY.tma_per_sm * kernels.multiprocessors(DEVICE)
    split = any(tma_split_k(-(-N // 16) * -(-M // 16), -(-K // 32), programs) > 1 for M in (5, 17))
    counts = [buffers[1] for key, buffers in kernels.KEPT.items() if key[0] == "tma-split-k"]
    assert (counts or not split) and all(int(c.abs().sum()) == 0 for c in counts)


def noting_tma_flag(monkeypatch, name: str) -> list:
    """`_gemv_tma_kernel` replaced by itself noting the constexpr `name` of each launch: the list
    the values go to, in launch order."""
    from inferlab.fast.kernels import tma

    kernel, seen = tma._gemv_tma_kernel, []

    class Noting:
        def __getitem__(self, grid):
            def launch(*args, **flags):
                seen.append(flags[name])
                return kernel[grid](*args, **flags)
            return launch

    monkeypatch.setattr(tma, "_gemv_tma_kernel", Noting())
    return seen


@pytest.mark.parametrize("variant", ["gated", "residual"])
@pytest.mark.parametrize("target", [1, 6])
def test_the_tma_kernels_early_first_tile_sums_in_the_same_order(kernels, variant, target, monkeypatch):
    """`tma_early` moves the first tile's copy before the wait, not its place in the sum: the same
    bits as without, K whole and split."""
    early_flags = noting_tma_flag(monkeypatch, "EARLY")
    x, weight, kwargs = gemv_case(5, "masked", variant, torch.float32)
    config = kernels.LaunchConfig(block_n=16, block_k=32, num_warps=4, num_stages=2)
    rows = {(*SHAPES["masked"], variant == "gated", 8): kernels.RowsLaunch("tma", config, target_programs=target)}
    late, early = (kernels.gemv(x, weight, policy=kernels.LaunchPolicy(rows_min_batch=2, rows=rows, tma_early=e), **kwargs)
                   for e in (False, True))
    assert torch.equal(late, early) and late.abs().max() > 0 and early_flags == [False, True]


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float16])  # fp16: a 2-byte input under the interpreter too
@pytest.mark.parametrize("variant", ["norm", "gated"])
@pytest.mark.parametrize("M", [4, 5, 17])
def test_the_tma_kernels_rms_pass_at_once_is_the_specified_function(kernels, dtype, variant, M, monkeypatch):
    """`rms_at_once`: the RMS pass sums its tiles' squares element by element and reduces once. K =
    1104 makes 3 tiles of 512 columns at 16 rows (the last masked), 2 of 1024 at 8 (5 rows) and
    one of 2048 at 4, where the two passes give the same bits; its rows are 16-byte aligned in
    every dtype, as a TMA descriptor needs (else the tensor-core kernel runs instead):
    the specification's function, and in fp32 the loop's result to the tolerance of the same sums
    in another order (`assert_same_function`: the scale differs in its last bits)."""
    flags_seen = noting_tma_flag(monkeypatch, "RMS_AT_ONCE")
    N, K = 40, 1104
    x, norm = draw(M, K, dtype=dtype, seed=1), draw(K, dtype=dtype, seed=2)
    weight = draw(2 * N if variant == "gated" else N, K, dtype=dtype, seed=4, scale=0.1)
    kwargs = dict(norm=norm, eps=1e-5, gated=variant == "gated")
    config = kernels.LaunchConfig(block_n=16, block_k=128, num_warps=4, num_stages=2)
    rows = {(N, K, variant == "gated", min(16, 1 << (M - 1).bit_length())): kernels.RowsLaunch("tma", config,
                                                                                               target_programs=6)}
    loop, at_once = (kernels.gemv(x, weight, policy=kernels.LaunchPolicy(rows_min_batch=2, rows=rows, rms_at_once=a),
                                  **kwargs) for a in (False, True))
    assert flags_seen == [False, True]
    assert_same_function(at_once, decode_ops.gemv(x, weight, **kwargs))
    assert at_once.abs().max() > 0
    if M == 4:
        assert torch.equal(at_once, loop)
    elif dtype == torch.float32:
        assert_same_function(at_once, loop)


@pytest.mark.parametrize("tiles, k_tiles, target, split", [
    (88, 16, 264, 3),   # [gate; up] in tiles of 64 rows: 264 programs, not a power of two
    (32, 44, 264, 8),   # down
    (500, 16, 264, 1),  # the LM head: enough tiles already
    (32, 2, 1000, 2),   # never more ranges than K tiles
    (0, 4, 8, 4),
])
def test_the_tma_kernel_cuts_k_until_its_programs_reach_the_target(tiles, k_tiles, target, split):
    from inferlab.fast.kernels.tma import tma_split_k

    assert tma_split_k(tiles, k_tiles, target) == split


@pytest.mark.parametrize("wanted, k_tiles, split_k, tiles", [(0, 8, 1, 0), (1, 8, 4, 1), (3, 8, 1, 2), (8, 16, 3, 4),
                                                              (8, 3, 2, 2), (100, 22, 1, 16)])
def test_a_tma_program_prefetches_a_power_of_two_of_its_own_tiles(wanted, k_tiles, split_k, tiles):
    from inferlab.fast.kernels.tma import tma_prefetch_tiles

    assert tma_prefetch_tiles(wanted, k_tiles, split_k) == tiles


@pytest.mark.parametrize("n0, k_first", [(0, 0), (40, 64), (96, 96)])
def test_the_prefetched_lines_stay_inside_the_weight_and_cover_the_tile(n0, k_first):
    """`_l2_lines`: one offset per 32-element line of rows n0 .. n0 + 16 and columns k_first ..
    k_first + 64 of a [100, 128] weight; rows and columns past its edge are its last ones."""
    out = torch.zeros(16, 2, dtype=torch.int64, device=DEVICE)
    _prefetched_lines[(1,)](out, n0, k_first, ROWS=100, K=128)
    rows = [min(n0 + r, 99) for r in range(16)]
    cols = [min(k_first + c * 32, 127) for c in range(2)]
    assert out.cpu().tolist() == [[row * 128 + col for col in cols] for row in rows]


def test_the_tma_policy_runs_the_tma_kernel_from_its_switch_where_a_descriptor_fits(kernels, record_launches):
    """From `rows_min_batch` rows `_gemv_tma_kernel`; a weight whose rows are not 16-byte aligned
    (37 float32 columns) cannot have a descriptor and runs the tensor-core kernel instead."""
    launched = record_launches(("_gemv_kernel", "_gemv_rows_kernel", "_gemv_tma_kernel"))
    policy = kernels.LaunchPolicy(batched="tma", rows={}, default_gemv=kernels.LaunchConfig(8, 64, 4, 1),
                                  tma_gemv=kernels.LaunchConfig(16, 32, 4, 1))
    for K in (64, 37):
        weight = draw(32, K, seed=4, scale=0.1)
        for M in (1, 4):
            x = draw(M, K, seed=M)
            assert_same_function(kernels.Kernels(pdl=False, policy=policy).gemv(x, weight), decode_ops.gemv(x, weight))
    assert launched == ["_gemv_kernel", "_gemv_tma_kernel", "_gemv_kernel", "_gemv_rows_kernel"]
    assert policy.rows_launch(32, 64, False, 4) == kernels.RowsLaunch("tma", kernels.LaunchConfig(16, 32, 4, 1))
    with pytest.raises(ValueError, match="tma_per_sm"):
        kernels.LaunchPolicy(tma_per_sm=0)
    with pytest.raises(ValueError, match="tma_prefetch"):
        kernels.LaunchPolicy(tma_prefetch=-1)


@pytest.mark.parametrize("n_tiles, k_tiles, target, split", [
    (64, 8, 0, 1),      # off
    (176, 8, 132, 1),   # enough tiles already
    (64, 8, 132, 4),    # 64 tiles -> 3 ranges wanted -> a power of two
    (64, 22, 264, 8),   # down: K of 22 tiles
    (64, 2, 1000, 2),   # never more ranges than K tiles
])
def test_k_is_cut_until_the_programs_reach_the_target(kernels, n_tiles, k_tiles, target, split):
    assert kernels.rows_split_k(n_tiles, k_tiles, target) == split


@pytest.mark.parametrize("rows_min_batch", [2, 4])
def test_a_launch_policy_picks_the_kernel_without_touching_module_state(kernels, record_launches, rows_min_batch):
    """Three rows run one program each under the default policy and the batched default (the TMA
    kernel) under rows_min_batch=2; either way the function is the specification's, and the
    defaults stay as they were."""
    launched = record_launches(("_gemv_kernel", "_gemv_rows_kernel", "_gemv_tma_kernel"))
    x, weight = draw(3, 64, seed=1), draw(16, 64, seed=4, scale=0.1)
    policy = kernels.LaunchPolicy(rows_min_batch=rows_min_batch, default_gemv=kernels.LaunchConfig(8, 64, 4, 1),
                                  tma_gemv=kernels.LaunchConfig(16, 64, 4, 1))
    ours = kernels.Kernels(pdl=False, policy=policy).gemv(x, weight)
    assert_same_function(ours, decode_ops.gemv(x, weight))
    assert launched == (["_gemv_tma_kernel"] if rows_min_batch <= 3 else ["_gemv_kernel"])
    assert kernels.DEFAULT_POLICY.batched == "tma"
    assert kernels.DEFAULT_POLICY == kernels.LaunchPolicy() and kernels.DEFAULT_POLICY.rows_min_batch == 4


def test_the_cuda_policy_runs_the_batch_kernel_from_two_rows_to_its_limit(kernels, record_launches):
    launched = record_launches(("_gemv_kernel", "_gemv_rows_kernel", "_gemv_batch_kernel"))
    weight = draw(16, 64, seed=4, scale=0.1)
    policy = kernels.LaunchPolicy(batched="cuda", cuda_max_rows=4, default_gemv=kernels.LaunchConfig(8, 64, 4, 1),
                                  rows_gemv=kernels.LaunchConfig(16, 64, 4, 1))
    for M in (1, 2, 4, 5):
        x = draw(M, 64, seed=M)
        assert_same_function(kernels.Kernels(pdl=False, policy=policy).gemv(x, weight), decode_ops.gemv(x, weight))
    assert launched == ["_gemv_kernel", "_gemv_batch_kernel", "_gemv_batch_kernel", "_gemv_rows_kernel"]
    with pytest.raises(ValueError, match="batched"):
        kernels.LaunchPolicy(batched="tensor cores")


def test_a_matrix_measured_at_a_row_count_runs_its_own_kernel_there_and_only_there(kernels, record_launches):
    """`LaunchPolicy.rows`: the [16, 64] matrix measured at 4 rows on the CUDA cores and at 16 rows
    split over K runs so at 3-4 and 9-16 rows (and beyond 16, in tiles of 16 rows); other row counts
    below the policy's switch, and other matrices, keep the policy-wide kernel. Each computes the
    specification's function; the CUDA-core entry is not used beyond the CUDA-core kernel's limit."""
    launched = record_launches(("_gemv_kernel", "_gemv_rows_kernel", "_gemv_batch_kernel"))
    small = kernels.LaunchConfig(8, 64, 4, 1)
    table = {(16, 64, False, 4): kernels.RowsLaunch("cuda", small),
             (16, 64, False, 16): kernels.RowsLaunch("tensor", kernels.LaunchConfig(16, 32, 4, 1), target_programs=4),
             (16, 64, False, 8): kernels.RowsLaunch("row", small)}
    policy = kernels.LaunchPolicy(batched="tensor", default_gemv=small, rows_gemv=kernels.LaunchConfig(16, 64, 4, 1),
                                  rows=table)
    weight, other = draw(16, 64, seed=4, scale=0.1), draw(32, 64, seed=5, scale=0.1)
    run = kernels.Kernels(pdl=False, policy=policy).gemv
    for M, w in ((3, weight), (4, weight), (8, weight), (16, weight), (20, weight), (4, other)):
        x = draw(M, 64, seed=M)
        assert_same_function(run(x, w), decode_ops.gemv(x, w))
    assert launched == ["_gemv_kernel", "_gemv_batch_kernel", "_gemv_kernel", "_gemv_rows_kernel", "_gemv_rows_kernel",
                        "_gemv_rows_kernel"]
    assert policy.rows_launch(16, 64, False, 16).target_programs == 4
    assert policy.rows_launch(16, 64, False, 5) == table[(16, 64, False, 8)]


def test_below_the_switch_only_a_launch_measured_at_exactly_that_many_rows_applies(kernels):
    """A stream-K launch measured at 1 row serves 1 row; 3 rows (rounded to the 4-row key) stay
    in the one-row kernel below `rows_min_batch`, as they did before any 1-row entry existed."""
    stream = kernels.RowsLaunch("stream", kernels.LaunchConfig(16, 32, 4, 1), target_programs=3)
    table = {(16, 64, False, 1): stream, (16, 64, False, 4): kernels.RowsLaunch("tensor")}
    policy = kernels.LaunchPolicy(rows=table)
    assert policy.rows_launch(16, 64, False, 1) == stream
    assert policy.rows_launch(16, 64, False, 2).kernel == policy.rows_launch(16, 64, False, 3).kernel == "row"
    assert policy.rows_launch(16, 64, False, 4) == table[(16, 64, False, 4)]
    assert policy.rows_launch(32, 64, False, 1).kernel == "row"
    x, weight = draw(1, 64, seed=1), draw(16, 64, seed=4, scale=0.1)
    assert_same_function(kernels.Kernels(pdl=False, policy=policy).gemv(x, weight), decode_ops.gemv(x, weight))
    narrow = kernels.LaunchPolicy(cuda_max_rows=2, rows=table)
    assert narrow.rows_launch(16, 64, False, 4).kernel == "tensor"
    assert kernels.LaunchPolicy(rows={}).rows_launch(2560, 2048, False, 4) == kernels.RowsLaunch("tma", kernels.TMA_GEMV)
    assert kernels.LaunchPolicy(batched="tensor", rows={}).rows_launch(2560, 2048, False, 4) == kernels.RowsLaunch(
        "tensor", kernels.ROWS_GEMV)
    with pytest.raises(ValueError, match="RowsLaunch kernel"):
        kernels.RowsLaunch("tensor cores")


@pytest.mark.parametrize("table", ["MEASURED_ROWS", "TENSOR_ROWS"])
def test_the_measured_batched_launches_are_the_shapes_the_engine_runs(kernels, table):
    """MEASURED_ROWS (the default) and TENSOR_ROWS (the tensor-core kernel's) key TinyLlama's
    matrices as the engine multiplies them, at row counts a key can take; the CUDA-core entries fit
    that kernel's row limit."""
    matrices = {(n, k, gated) for n, k, gated in kernels.MEASURED_GEMV}
    policy = kernels.DEFAULT_POLICY if table == "MEASURED_ROWS" else kernels.LaunchPolicy(
        batched="tensor", rows=kernels.TENSOR_ROWS)
    for (n, k, gated, rows), launch in getattr(kernels, table).items():
        assert (n, k, gated) in matrices and policy.rows_key(n, k, gated, rows)[3] == rows
        assert launch.kernel != "cuda" or rows <= policy.cuda_max_rows
        assert policy.rows_launch(n, k, gated, rows) == launch


def traced_step(kernels, tiny, policy) -> tuple:
    """One decode step of tiny-random (fp32) at position 5 of a 16-position cache, through
    `RecordingOps` over the kernels in `policy`: (its recorded calls, its logits, the layers)."""
    from inferlab.fast.engine import FastLlama
    from inferlab.look.fast_trace import RecordingOps
    from inferlab.model.registry import load_model

    net = FastLlama(tiny.model if DEVICE.type == "cpu" else load_model("tiny-random", DEVICE, torch.float32).model)
    cache = net.new_cache(1, 16)
    ops = RecordingOps(kernels.Kernels(pdl=False, policy=policy), net, cache)
    logits = net.decode(torch.tensor([[3]], device=DEVICE), torch.tensor([5], device=DEVICE), cache, ops)
    return ops.calls, logits, len(net.layers)


def attention_inputs(M, heads, kv_heads, hd, T, dtype):
    """qkv [M, (heads + 2 kv_heads) hd], RoPE tables cos, sin [T, hd] (half-split layout) and
    caches [M, kv_heads, T, hd], drawn from fixed seeds (the caches' seeds 7 and 8)."""
    qkv = draw(M, (heads + 2 * kv_heads) * hd, dtype=dtype, seed=5)
    angles = draw(T, hd // 2, seed=6)
    angles = torch.cat([angles, angles], dim=-1)
    k_cache, v_cache = draw(M, kv_heads, T, hd, dtype=dtype, seed=7), draw(M, kv_heads, T, hd, dtype=dtype, seed=8)
    return qkv, angles.cos().to(dtype), angles.sin().to(dtype), k_cache, v_cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("position", [0, 5, 11])
@pytest.mark.parametrize("range_positions", [0, 4, 8])  # 0: one program per head; else ranges merged after
@pytest.mark.parametrize("heads", [4, 6])  # GQA groups of 2; of 3 (padded to 4 in the ranges' partial results)
def test_attention_kernel_matches_the_specification_and_writes_the_cache(kernels, dtype, position, range_positions,
                                                                          heads):
    M, kv_heads, hd, T = 2, 2, 16, 12
    qkv, cos, sin, k_cache, v_cache = attention_inputs(M, heads, kv_heads, hd, T, dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    at = torch.tensor([position], device=DEVICE)
    expected = decode_ops.attention_decode(qkv, cos, sin, at, expected_k, expected_v, heads, kv_heads)
    # block_t 4 < position: the loop over cached positions runs several masked blocks; ranges of 4
    # or 8 positions: 4 or 2 ranges (12 cached positions), empty ones past the position
    ours = kernels.attention_decode(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads, block_t=4,
                                    range_positions=range_positions)
    assert_same_function(ours, expected)
    assert_same_function(k_cache, expected_k)
    assert torch.equal(v_cache, expected_v)  # v is stored as given, no arithmetic
    untouched = [t for t in range(T) if t != position]
    assert torch.equal(k_cache[:, :, untouched], draw(M, kv_heads, T, hd, dtype=dtype, seed=7)[:, :, untouched])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("range_positions", [4, 8])  # 4 or 2 ranges of the 12 cached positions
@pytest.mark.parametrize("heads", [4, 6])
def test_the_last_range_to_finish_merges_the_heads_launch_after_launch(kernels, record_launches, dtype, range_positions,
                                                                       heads):
    """`combine="last"`: no combine kernel; the last of each head's ranges to count itself merges
    them, empty ranges included (position 0, 5), and resets its count to 0 for the next launch."""
    M, kv_heads, hd, T = 2, 2, 16, 12
    qkv, cos, sin, k_cache, v_cache = attention_inputs(M, heads, kv_heads, hd, T, dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    launched = record_launches(("_attention_combine_kernel",))
    for position in (0, 5, 11):
        at = torch.tensor([position], device=DEVICE)
        expected = decode_ops.attention_decode(qkv, cos, sin, at, expected_k, expected_v, heads, kv_heads)
        ours = kernels.attention_decode(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads, block_t=4,
                                        range_positions=range_positions, combine="last")
        assert_same_function(ours, expected)
        assert_same_function(k_cache, expected_k)
        assert torch.equal(v_cache, expected_v)
        qkv = qkv.roll(1, dims=1)  # another token
    assert not launched
    counts = [buffers[0] for key, buffers in kernels.KEPT.items() if key[0] == "head-arrivals"]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (6, 2)])  # groups of 2; of 3 (padded to 4 in the kernel)
@pytest.mark.parametrize("splits, chunk, combine", [(1, None, "last"), (4, None, "last"), (8, 2, "last"),
                                                   (1, None, "kernel"), (8, None, "kernel")])
def test_split_attention_matches_the_specification_at_every_position_and_resets_its_counts(
        kernels, dtype, heads, kv_heads, splits, chunk, combine):
    """Cut into `splits` ranges of 4-position tiles: empty ranges (position 0, 5), ranges of
    several tiles with a masked end (37), combined in the kernel all at once or `chunk` ranges at
    a time, or by the combine kernel, and launch after launch on one scratch: the arrival counts
    must be back at 0 after each launch for the next one's combine to run."""
    M, hd, T = 2, 16, 48
    qkv, cos, sin, k_cache, v_cache = attention_inputs(M, heads, kv_heads, hd, T, dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for position in (0, 5, 37, 47):
        at = torch.tensor([position], device=DEVICE)
        expected = decode_ops.attention_decode(qkv, cos, sin, at, expected_k, expected_v, heads, kv_heads)
        ours = kernels.attention_decode_split(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads,
                                              block_t=4, splits=splits, chunk=chunk, combine=combine)
        assert_same_function(ours, expected)
        assert_same_function(k_cache, expected_k)
        assert torch.equal(v_cache, expected_v)
        qkv = qkv.roll(1, dims=1)  # another token
    counts = [buffers[3] for key, buffers in kernels.KEPT.items() if key[0] == "attention"]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)


@pytest.mark.parametrize("cache_length, splits", [(16, 1), (32, 1), (33, 2), (65, 4), (256, 8), (1024, 32), (2048, 64),
                                                  (32768, 64)])
def test_the_context_is_cut_into_a_power_of_two_of_ranges_by_the_cache_length(kernels, cache_length, splits):
    assert kernels.attention_splits(cache_length) == splits


@pytest.mark.parametrize("splits, g_pad, hd, chunk", [(64, 8, 64, 8), (8, 8, 64, 8), (4, 8, 64, 4), (64, 4, 64, 16),
                                                      (64, 2, 16, 64), (1, 8, 64, 1)])
def test_the_combine_loads_as_many_ranges_as_fit_4096_floats(kernels, splits, g_pad, hd, chunk):
    assert kernels.combine_chunk(splits, g_pad, hd) == chunk


def test_the_launch_policy_chooses_the_attention_kernel_and_its_ranges(kernels, monkeypatch):
    launched = []
    for name in ("attention_decode", "attention_decode_split"):
        monkeypatch.setattr(kernels, name, lambda *a, name=name, **k: launched.append(
            (name, k.get("splits"), k.get("combine"), k.get("block_t"), k.get("range_positions"))))
    cache = torch.zeros(1, 2, 512, 16)
    operands = (torch.zeros(1, 128), None, None, None, cache, cache, 4, 2)  # one row
    kernels.Kernels().attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(attention="split")).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(attention="split", split_positions=128)).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(attention="auto", split_min_cache=512)).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(attention="auto", split_min_cache=513)).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(attention="split", split_combine="kernel")).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(head_block_t=32)).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(head_block_t=32, head_range=256)).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(head_block_t=32, head_range=512)).attention_decode(*operands)
    split, head, t, h = "attention_decode_split", "attention_decode", kernels.SPLIT_BLOCK_T, kernels.ATTENTION_BLOCK_T
    kernels.Kernels(policy=kernels.LaunchPolicy(head_range=0)).attention_decode(*operands)
    kernels.Kernels(policy=kernels.LaunchPolicy(head_combine="last")).attention_decode(*operands)
    r = kernels.DEFAULT_POLICY.head_range
    assert launched == [(kernels.DEFAULT_POLICY.attention_kernel(512), None, "kernel", h, r),
                        (split, 16, "last", t, None), (split, 4, "last", t, None), (split, 16, "last", t, None),
                        (head, None, "kernel", h, r), (split, 16, "kernel", t, None), (head, None, "kernel", 32, r),
                        (head, None, "kernel", 32, 256), (head, None, "kernel", 32, 0),  # one range: none
                        (head, None, "kernel", h, 0), (head, None, "last", h, r)]
    assert r == 128  # the default: ranges of 128 positions (docs/perf/h200/kernels.md)
    with pytest.raises(ValueError, match="attention"):
        kernels.LaunchPolicy(attention="flash")
    with pytest.raises(ValueError, match="split_combine"):
        kernels.LaunchPolicy(split_combine="atomic")
    with pytest.raises(ValueError, match="head_combine"):
        kernels.LaunchPolicy(head_combine="atomic")
    with pytest.raises(ValueError, match="head_range must be 0 or a multiple of head_block_t"):
        kernels.LaunchPolicy(head_block_t=256)  # the default ranges of 128 hold no whole tile


def test_a_decode_step_counts_one_kernel_more_a_layer_where_a_second_kernel_merges_ranges(kernels):
    """Five kernels a layer (four projections and the attention), plus the LM head and the step
    kernel; six a layer where a combine kernel merges the attention's ranges."""
    policy, layers = kernels.DEFAULT_POLICY, 22
    assert policy.decode_kernels(layers, 128) == 22 * 5 + 2  # one range: no combine
    assert policy.decode_kernels(layers, 256) == 22 * 5 + 2  # read in one tile (head_whole_cache) at up to 4 rows
    assert policy.decode_kernels(layers, 256, batch=8) == 22 * 6 + 2  # two ranges of 128, merged by a second kernel
    assert policy.decode_kernels(layers, 257) == 22 * 6 + 2  # longer than one tile: three ranges
    ranges = kernels.LaunchPolicy(head_whole_cache=0)
    assert ranges.decode_kernels(layers, 256) == 22 * 6 + 2
    assert kernels.LaunchPolicy(head_whole_cache=0, head_combine="last").decode_kernels(layers, 256) == 22 * 5 + 2
    assert kernels.LaunchPolicy(head_range=0).decode_kernels(layers, 2048) == 22 * 5 + 2
    assert kernels.LaunchPolicy(attention="split").decode_kernels(layers, 256) == 22 * 5 + 2  # merged by the last
    assert kernels.LaunchPolicy(attention="split", split_combine="kernel").decode_kernels(layers, 256) == 22 * 6 + 2


@pytest.mark.parametrize("policy", [dict(head_block_t=4, head_range=8, head_whole_cache=0),
                                    dict(head_block_t=4, head_range=8, head_whole_cache=0, head_combine="last"),
                                    dict(head_block_t=4, head_range=0), dict(attention="split", split_combine="kernel"),
                                    dict(attention_o_cache=16), dict(qkv_attention_cache=16),
                                    {}])  # {}: the default, the cache in one tile
def test_a_greedy_decode_step_launches_as_many_kernels_as_its_policy_counts(kernels, tiny, record_launches, policy):
    launched = record_launches((
        "_gemv_kernel", "_gemv_rows_kernel", "_gemv_batch_kernel", "_attention_decode_kernel", "_attention_split_kernel",
        "_attention_combine_kernel", "_attention_o_kernel", "_qkv_attention_kernel", "_greedy_step_kernel"))
    net = FastLlama(tiny.model)
    cache_length, first = 16, 5
    cache = net.new_cache(1, cache_length)  # two ranges of 8 positions
    ops = kernels.Kernels(pdl=False, policy=kernels.LaunchPolicy(**policy))
    hidden = net.embed[3:4].clone()
    tokens, out = torch.zeros(1, 1, dtype=torch.long, device=DEVICE), torch.zeros(1, 8, dtype=torch.long, device=DEVICE)
    position = torch.tensor([first], device=DEVICE)
    logits = net.decode_hidden(hidden, position, cache, ops)
    ops.greedy_step(logits, net.embed, hidden, tokens, out, position, first)
    assert len(launched) == ops.policy.decode_kernels(len(net.layers), cache_length)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_cache_in_one_tile_of_8_warps_attends_as_specified_without_a_combine_kernel(kernels, record_launches, dtype):
    """`LaunchPolicy(head_block_t=T, head_range=T, head_warps=8)` over a cache of T positions: one
    program a head holds the whole cache in one tile (read before the wait), no ranges to merge."""
    M, heads, kv_heads, hd, T = 2, 4, 2, 16, 16
    qkv, cos, sin, k_cache, v_cache = attention_inputs(M, heads, kv_heads, hd, T, dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    launched = record_launches(("_attention_decode_kernel", "_attention_combine_kernel"))
    ops = kernels.Kernels(policy=kernels.LaunchPolicy(head_block_t=T, head_range=T, head_warps=8))
    for position in (0, 9, T - 1):
        at = torch.tensor([position], device=DEVICE)
        expected = decode_ops.attention_decode(qkv, cos, sin, at, expected_k, expected_v, heads, kv_heads)
        assert_same_function(ops.attention_decode(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads), expected)
        assert_same_function(k_cache, expected_k)
        assert torch.equal(v_cache, expected_v)
    assert launched == ["_attention_decode_kernel"] * 3
    with pytest.raises(ValueError, match="head_warps must be a power of two, not 6"):
        kernels.LaunchPolicy(head_warps=6)


def test_head_whole_cache_reads_short_caches_in_one_tile_and_longer_ones_in_ranges(kernels, record_launches):
    policy = kernels.DEFAULT_POLICY  # 256 positions at up to 4 rows (docs/perf/h100/attention-o.md)
    assert (policy.head_whole_cache, policy.head_whole_rows) == (256, 4)
    assert policy.head_launch_for(256) == (256, 0, 8) and policy.head_launch_for(200, 4) == (256, 0, 8)
    assert policy.head_launch_for(257) == (kernels.ATTENTION_BLOCK_T, 128, 4) == policy.head_launch_for(256, 5)
    assert kernels.LaunchPolicy(head_whole_cache=0).head_launch_for(256) == (128, 128, 4)  # off: 2 ranges, a combine
    assert kernels.LaunchPolicy(head_whole_rows=16).head_launch_for(256, 16) == (256, 0, 8)
    assert policy.decode_kernels(22, 256) == 22 * 5 + 2 and policy.decode_kernels(22, 2048) == 22 * 6 + 2
    with pytest.raises(ValueError, match="head_whole_warps must be a power of two, not 3"):
        kernels.LaunchPolicy(head_whole_warps=3)
    with pytest.raises(ValueError, match="head_whole_rows must be 1 or more, not 0"):
        kernels.LaunchPolicy(head_whole_rows=0)
    M, heads, kv_heads, hd = 1, 4, 2, 16
    launched = record_launches(("_attention_decode_kernel", "_attention_combine_kernel"))
    ops = kernels.Kernels(policy=kernels.LaunchPolicy(head_whole_cache=16, head_block_t=4, head_range=8))
    for T, position in ((16, 13), (24, 21)):  # one tile of 16; three ranges of 8 (4 with the empty one), combined
        qkv, cos, sin, k_cache, v_cache = attention_inputs(M, heads, kv_heads, hd, T, torch.float32)
        expected_k, expected_v = k_cache.clone(), v_cache.clone()
        at = torch.tensor([position], device=DEVICE)
        expected = decode_ops.attention_decode(qkv, cos, sin, at, expected_k, expected_v, heads, kv_heads)
        assert_same_function(ops.attention_decode(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads), expected)
        assert torch.equal(v_cache, expected_v)
    assert launched == ["_attention_decode_kernel", "_attention_decode_kernel", "_attention_combine_kernel"]


def test_attention_specification_is_softmax_attention_over_the_written_cache():
    M, heads, kv_heads, hd, T, position = 1, 2, 1, 4, 6, 3
    qkv = draw(M, (heads + 2 * kv_heads) * hd, seed=9)
    cos, sin = torch.ones(T, hd), torch.zeros(T, hd)  # RoPE at angle 0 is the identity
    k_cache, v_cache = draw(M, kv_heads, T, hd, seed=10), draw(M, kv_heads, T, hd, seed=11)
    out = decode_ops.attention_decode(qkv, cos, sin, torch.tensor([position]), k_cache, v_cache, heads, kv_heads)
    q = qkv[0, : heads * hd].view(heads, hd)
    keys, values = k_cache[0, 0, : position + 1], v_cache[0, 0, : position + 1]
    assert torch.equal(keys[-1], qkv[0, heads * hd : (heads + 1) * hd])  # the new key landed at `position`
    expected = torch.softmax(q @ keys.T / hd**0.5, dim=-1) @ values  # both query heads share the one KV head
    torch.testing.assert_close(out.view(heads, hd), expected)


@pytest.mark.parametrize("ops", ["spec", "kernel"])
def test_greedy_step_takes_the_first_maximum_and_advances_the_step(kernels, ops):
    block = kernels.GREEDY_BLOCK_V
    M, V, H, N, first = 2, block + 808, 24, 6, 10  # two blocks over the vocabulary, the second masked
    logits = draw(M, V, seed=12)
    logits[0, [17, block + 300]] = 9.0  # a tie across blocks: the first index wins
    logits[1, [block + 8, block + 9]] = 7.0  # a tie inside the last block
    embed = draw(V, H, seed=13)
    hidden, tokens = torch.zeros(M, H, device=DEVICE), torch.zeros(M, 1, dtype=torch.long, device=DEVICE)
    out = torch.full((M, N), -1, dtype=torch.long, device=DEVICE)
    position = torch.tensor([first + 2], device=DEVICE)
    (decode_ops if ops == "spec" else kernels).greedy_step(logits, embed, hidden, tokens, out, position, first)
    expected = [17, block + 8]
    assert tokens[:, 0].tolist() == expected
    assert out[:, 3].tolist() == expected and int((out == -1).sum()) == M * (N - 1)
    assert torch.equal(hidden, embed[expected])
    assert position.tolist() == [first + 3]  # advanced once, by the last row to finish
    if ops == "kernel":
        counts = [buffers[0] for key, buffers in kernels.KEPT.items() if key[0] == "greedy"]
        assert counts and all(int(c) == 0 for c in counts)  # ready for the next step


SAMPLINGS = {
    "temperature": dict(temperature=0.7),
    "top-k": dict(temperature=1.0, top_k=20),
    "top-p": dict(temperature=1.0, top_p=0.9),
    "all": dict(temperature=0.8, top_k=50, top_p=0.9),
    "top-p-narrow": dict(temperature=0.5, top_p=0.3),
}


def sample_case(kernels, M: int, V: int, H: int, first: int, seed: int):
    """Logits [M, V] (spread like a real LM head's: a few tall ones over a broad base), uniform draws, buffers."""
    logits = draw(M, V, seed=seed, scale=2.0)
    logits[:, :7] += torch.linspace(6.0, 3.0, 7, device=DEVICE)
    uniform = torch.rand(M, V, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE)
    embed = draw(V, H, seed=seed + 2)
    hidden, tokens = torch.zeros(M, H, device=DEVICE), torch.zeros(M, 1, dtype=torch.long, device=DEVICE)
    out = torch.full((M, 6), -1, dtype=torch.long, device=DEVICE)
    return logits, uniform, embed, hidden, tokens, out, torch.tensor([first + 2], device=DEVICE)


def sampler(kernels, kind: str, V: int):
    """The sampling kernel `kind`: "row" (`sample_step`, one program a row) or "split"
    (`sample_step_split`); on a GPU as the engine launches it, under the interpreter split in four
    programs a row that each take their chunk in one tile (fewer operations to interpret)."""
    if kind == "row":
        return kernels.sample_step
    if DEVICE.type == "cuda":
        return kernels.sample_step_split
    chunk = max(256, 1 << (V // 4 - 1).bit_length())
    return functools.partial(kernels.sample_step_split, chunk=chunk, sub=chunk)


@pytest.mark.parametrize("kind", ["row", "split"])
@pytest.mark.parametrize("V", [1000, 32000])
@pytest.mark.parametrize("name", list(SAMPLINGS))
def test_the_sampling_kernels_draw_what_the_sorted_torch_step_draws(kernels, name, V, kind):
    """Three rows, fresh draws: the token `pick` (temperature, top-k, top-p with a sort, the
    exponential race) chooses, its embedding, the out column and one position step."""
    from inferlab.decode.sampling import SamplingConfig
    from inferlab.fast.engine import pick

    sampling = SamplingConfig(greedy=False, **SAMPLINGS[name])
    step = sampler(kernels, kind, V)
    for seed in (20, 30):
        logits, uniform, embed, hidden, tokens, out, position = sample_case(kernels, 3, V, 24, 10, seed)
        expected = pick(logits, sampling, uniform)
        step(logits, sampling, uniform, embed, hidden, tokens, out, position, 10)
        assert tokens[:, 0].tolist() == expected.tolist()
        assert out[:, 3].tolist() == expected.tolist() and int((out == -1).sum()) == 3 * 5
        assert torch.equal(hidden, embed[expected]) and position.tolist() == [13]
    # arrival counts back at 0 for the next launch: the rows' (both kernels) and the split kernel's barriers
    counts = [buffer for key, buffers in kernels.KEPT.items() if key[0] in ("sample", "sample-split")
              for buffer in buffers if buffer.dtype == torch.int32]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)
    assert kernels.barrier_errors(DEVICE) == 0


def test_the_split_sampling_kernel_phase_by_phase_draws_the_same_and_refuses_a_phase_it_lacks(kernels):
    """Each phase a launch of its own (how its phases are timed alone, and how the interpreter
    runs it): the same token as `pick`; the maximum, 4 top-p rounds and the race are 6 phases."""
    from inferlab.decode.sampling import SamplingConfig
    from inferlab.fast.engine import pick

    sampling = SamplingConfig(greedy=False, temperature=0.7, top_p=0.9)
    step = sampler(kernels, "split", 1000)
    assert kernels.split_phases(sampling, 1000) == 6
    logits, uniform, embed, hidden, tokens, out, position = sample_case(kernels, 2, 1000, 8, 10, 5)
    step(logits, sampling, uniform, embed, hidden, tokens, out, position, 10, phases=range(6))
    assert tokens[:, 0].tolist() == pick(logits, sampling, uniform).tolist() and position.tolist() == [13]
    with pytest.raises(ValueError, match="phases 0 to 5, not 6"):
        step(logits, sampling, uniform, embed, hidden, tokens, out, position, 10, phases=[6])


@pytest.mark.parametrize("kind", ["row", "split"])
def test_the_sampling_kernels_keep_the_nucleus_and_the_top_k_ties_and_nothing_else(kernels, kind):
    """The race is rigged: the uniform draw of one token is 1 - 1e-7 (its race value is ~1e7 x
    its probability), so that token wins if, and only if, it is kept."""
    from inferlab.decode.sampling import SamplingConfig
    from inferlab.fast.engine import pick

    V = 64
    step = sampler(kernels, kind, V)
    logits = torch.full((1, V), -20.0, device=DEVICE)
    logits[0, :4] = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05], device=DEVICE))  # the rest ~1e-9 each

    def winner(favoured: int, sampling: SamplingConfig) -> int:
        uniform = torch.full((1, V), 0.5, device=DEVICE)
        uniform[0, favoured] = 1.0 - 1e-7
        embed, hidden = draw(V, 4, seed=1), torch.zeros(1, 4, device=DEVICE)
        tokens, out = torch.zeros(1, 1, dtype=torch.long, device=DEVICE), torch.zeros(1, 4, dtype=torch.long, device=DEVICE)
        step(logits, sampling, uniform, embed, hidden, tokens, out, torch.tensor([0], device=DEVICE), 0)
        assert int(tokens[0, 0]) == int(pick(logits, sampling, uniform)[0])
        return int(tokens[0, 0])

    top_p = SamplingConfig(greedy=False, top_p=0.9)  # mass 0.5 + 0.3 + 0.15 = 0.95 >= 0.9: tokens 0, 1, 2
    assert [winner(t, top_p) for t in (0, 1, 2, 3, 40)] == [0, 1, 2, 0, 0]
    top_p_wide = SamplingConfig(greedy=False, top_p=0.97)  # 0.95 < 0.97: token 3 joins
    assert winner(3, top_p_wide) == 3 and winner(40, top_p_wide) == 0
    logits[0, 2] = logits[0, 1]  # a tie at the second place: top-2 keeps both, as torch's top-k does
    top_k = SamplingConfig(greedy=False, top_k=2)
    assert [winner(t, top_k) for t in (1, 2, 3)] == [1, 2, 0]


@pytest.mark.parametrize("candidates", [0, 1, 4, 8])
def test_the_sampling_kernel_takes_the_first_race_winner_in_the_nucleus_or_falls_back_to_its_threshold(
        kernels, candidates):
    """Top-p by candidates (`LaunchPolicy.sample_candidates`): the race's winners over the whole row
    are checked for the nucleus in race order. The race is rigged so that the first five winners
    are outside it (tokens 3-7, equal race values: taken in index order), then token 2 (inside),
    then token 0. With fewer than 6 candidates none of them is found and the threshold's bisection
    runs; with 8, the sixth candidate is the token. Each way the token is `pick`'s: 2."""
    from inferlab.decode.sampling import SamplingConfig
    from inferlab.fast.engine import pick

    V = 64
    probs = torch.full((V,), 1e-9)
    probs[:8] = torch.tensor([0.5, 0.3, 0.15, 0.01, 0.01, 0.01, 0.01, 0.01])  # nucleus at 0.9: tokens 0, 1, 2
    logits = torch.log(probs)[None].to(DEVICE)
    uniform = torch.full((1, V), 0.5, device=DEVICE)
    uniform[0, 3:8] = 1.0 - 1e-7  # race ~1e5 each
    uniform[0, 2] = 0.99  # race ~15, above token 0's 0.72
    sampling = SamplingConfig(greedy=False, top_p=0.9)
    embed, hidden = draw(V, 4, seed=1), torch.zeros(1, 4, device=DEVICE)
    tokens, out = torch.zeros(1, 1, dtype=torch.long, device=DEVICE), torch.zeros(1, 4, dtype=torch.long, device=DEVICE)
    kernels.sample_step(logits, sampling, uniform, embed, hidden, tokens, out, torch.tensor([0], device=DEVICE), 0,
                        candidates=candidates)
    assert int(pick(logits, sampling, uniform)[0]) == 2 and int(tokens[0, 0]) == 2
    with pytest.raises(ValueError, match="candidates must be 0 or more, not -1"):
        kernels.sample_step(logits, sampling, uniform, embed, hidden, tokens, out, torch.tensor([0], device=DEVICE), 0,
                            candidates=-1)


@pytest.mark.parametrize("V", [1, 3])
def test_the_sampling_kernel_draws_from_a_vocabulary_of_a_few_tokens(kernels, V):
    """A row narrower than the race's quarters: padded to 16, the tokens are still `pick`'s."""
    from inferlab.decode.sampling import SamplingConfig
    from inferlab.fast.engine import pick

    embed, hidden = draw(V, 4, seed=1), torch.zeros(2, 4, device=DEVICE)
    tokens, out = torch.zeros(2, 1, dtype=torch.long, device=DEVICE), torch.zeros(2, 4, dtype=torch.long, device=DEVICE)
    for name in ("top-p", "all", "temperature"):
        sampling = SamplingConfig(greedy=False, **SAMPLINGS[name])
        for seed in (1, 2, 3):
            logits = draw(2, V, seed=seed, scale=2.0)
            uniform = torch.rand(2, V, generator=torch.Generator().manual_seed(seed + 1)).to(DEVICE)
            position = torch.tensor([0], device=DEVICE)
            kernels.sample_step(logits, sampling, uniform, embed, hidden, tokens, out, position, 0)
            assert tokens[:, 0].tolist() == pick(logits, sampling, uniform).tolist()


@pytest.mark.parametrize("candidates", [0, 1])
@pytest.mark.parametrize("name", ["top-p", "all", "top-p-narrow"])
def test_top_p_by_candidates_or_by_bisection_draws_the_same_tokens(kernels, name, candidates):
    """Over fresh draws of a real LM head's shape, top-p found by bisection alone, or after a
    single candidate (the fallback whenever the race's winner is outside the nucleus: often at top-p
    0.3), draws what `pick` draws, as the default (4 candidates) does in the test above them."""
    from inferlab.decode.sampling import SamplingConfig
    from inferlab.fast.engine import pick

    sampling = SamplingConfig(greedy=False, **SAMPLINGS[name])
    for seed in (20, 30, 40):
        logits, uniform, embed, hidden, tokens, out, position = sample_case(kernels, 4, 1000, 8, 10, seed)
        kernels.sample_step(logits, sampling, uniform, embed, hidden, tokens, out, position, 10, candidates=candidates)
        assert tokens[:, 0].tolist() == pick(logits, sampling, uniform).tolist()


def test_the_sampling_kernel_refuses_a_vocabulary_that_would_not_fit_its_registers(kernels):
    from inferlab.decode.sampling import SamplingConfig

    assert kernels.sample_kernel_fits(32000) and not kernels.sample_kernel_fits(49152)
    logits = torch.zeros(1, 49152, device=DEVICE)
    with pytest.raises(ValueError, match="at most 32768 logits"):
        kernels.sample_step(logits, SamplingConfig(greedy=False), logits, torch.zeros(49152, 2, device=DEVICE),
                            torch.zeros(1, 2, device=DEVICE), torch.zeros(1, 1, dtype=torch.long, device=DEVICE),
                            torch.zeros(1, 2, dtype=torch.long, device=DEVICE), torch.tensor([0], device=DEVICE), 0)
    with pytest.raises(ValueError, match=r"sampling must be one of \['torch', 'kernel', 'split'\]"):
        kernels.LaunchPolicy(sampling="sort")


@torch.inference_mode()
def test_decode_with_the_specified_ops_gives_transformers_logits(tiny):
    prompt = random_prompt(tiny.model.config.vocab_size, 7, 2, torch.Generator().manual_seed(0), torch.device("cpu"))
    net = FastLlama(tiny.model)
    cache = net.new_cache(2, 12)
    ids = prompt.input_ids
    net(ids, torch.arange(7), cache, fresh=True)  # prefill writes positions 0..6
    for step in range(5):
        nxt = tiny.model(input_ids=ids).logits[:, -1].float().argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        ours = net.decode(nxt, torch.tensor([ids.shape[1] - 1]), cache, decode_ops)
        theirs = tiny.model(input_ids=ids).logits[:, -1].float()  # full recompute, no cache
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


# The engine with each launch policy: (batch, policy, context). The defaults at 2 rows (the GEMVs
# one program per row) and at 4 (the tensor-core kernel: the default policy's switch); every other
# policy once. Those that change only the attention, split-K, and the CUDA-core kernel with the
# other options as the defaults have them, at 4 rows: the attention kernels do not depend on the
# batch, and under the interpreter a tensor-core launch costs a fraction of one program per row
# (defaults-2 runs those). The rest at the rows they were written for; the rowwise kernel, which
# loops over the rows in each program, at 2 rows and at 3 (padded to 4), there with early loads named.
# `context`: the model's context, which caps the engine's cache (256 positions by default); 32 for
# ranges of 8 positions: 4 ranges (two read from position 9 on, two empty) instead of 32, mostly
# empty, whose programs the interpreter runs one by one.
ENGINE_POLICIES = {
    "defaults-2": (2, {}, None),
    "defaults-4": (4, {}, None),
    "split-attention-4": (4, {"attention": "split"}, None),
    "split-k-4": (4, {"batched": "tensor", "rows_min_batch": 2, "rows_target_programs": 1000}, None),
    "cuda-batch-4": (4, {"batched": "cuda"}, None),
    "auto-attention-4": (4, {"attention": "auto", "split_min_cache": 8}, None),
    # the attention variants merged by the combine kernel
    "split-combine-kernel-4": (4, {"attention": "split", "split_combine": "kernel"}, None),
    "head-ranges-4": (4, {"head_block_t": 8, "head_range": 8, "head_whole_cache": 0}, 32),
    "rows-prefetch-2": (2, {"batched": "tensor", "rows_min_batch": 2, "rows_prefetch": True}, None),
    "early-loads-1": (1, {"early_loads": True}, None),
    "head-ranges-last-1": (1, {"head_block_t": 8, "head_range": 8, "head_combine": "last", "head_whole_cache": 0},
                           32),
    "wide-rms-2": (2, {"batched": "tensor", "rows_min_batch": 2, "wide_rms": True}, None),
    "cuda-batch-early-wide-2": (2, {"batched": "cuda", "wide_rms": True, "early_loads": True}, None),
    "rowwise-2": (2, {"batched": "rowwise"}, None),
    "rowwise-early-3": (3, {"batched": "rowwise", "early_loads": True}, None),
    # the stream-K kernel: at 4 rows, and from 2 rows with its first unit loaded before the wait
    "stream-4": (4, {"batched": "stream", "rows": {}}, None),
    "stream-prefetch-2": (2, {"batched": "stream", "rows": {}, "rows_min_batch": 2, "stream_prefetch": True}, None),
    "stream-tma-4": (4, {"batched": "stream", "rows": {}, "stream_tma": True}, None),
    # the tensor-core kernel the TMA kernel replaced as the default, with its own table
    "tensor-4": (4, {"batched": "tensor", "rows": "TENSOR_ROWS"}, None),
    # the cache of 32 read whole in one tile of 8 warps, no combine kernel; and the next weights asked of L2
    "head-whole-1": (1, {"head_whole_cache": 32, "head_block_t": 8, "head_range": 8}, 32),
    "head-whole-4": (4, {"head_whole_cache": 32}, 32),
    "l2-ahead-1": (1, {"l2_ahead": 1 << 20}, None),
    "l2-ahead-4": (4, {"l2_ahead": 1 << 20}, None),
    # a layer's attention and o projection in one kernel: the cache of 32 read whole before the
    # wait; and in tiles of 8, the first before the wait, at 2 rows
    "attention-o-1": (1, {"attention_o_cache": 32, "attention_o_block_n": 16, "attention_o_registers": 64}, 32),
    "attention-o-tiles-2": (2, {"attention_o_cache": 32, "attention_o_rows": 2, "attention_o_block_t": 8}, 32),
    # a layer's [q; k; v] projection and attention in one launch: the cache's first 8 positions
    # before each head's wait, the rest after; at 2 rows, the cache of 32 whole before it
    "qkv-attention-1": (1, {"qkv_attention_cache": 32, "qkv_attention_block_t": 8, "qkv_attention_registers": 56}, 32),
    "qkv-attention-2": (2, {"qkv_attention_cache": 32, "qkv_attention_rows": 2, "qkv_attention_block_t": 32}, 32),
}


@pytest.fixture(scope="module")
def short_context():
    """tiny-random's weights (the same seed) with a context of 32 positions: the engine's cache holds 32."""
    from inferlab.model.registry import TINY_RANDOM_CONFIG, random_llama

    return random_llama({**TINY_RANDOM_CONFIG, "max_position_embeddings": 32}, DEVICE, torch.float32, 0).eval()


@pytest.mark.parametrize("batch, policy, context", list(ENGINE_POLICIES.values()), ids=list(ENGINE_POLICIES))
def test_fast_engine_with_triton_kernels_gives_the_eager_loops_tokens(kernels, tiny, short_context, batch, policy,
                                                                     context):
    from inferlab.model.registry import load_model

    if context:
        model = short_context
        assert model.config.max_position_embeddings == context
    else:
        model = tiny.model if DEVICE.type == "cpu" else load_model("tiny-random", DEVICE, torch.float32).model
    prompt = random_prompt(model.config.vocab_size, 6, batch, torch.Generator().manual_seed(3), DEVICE)
    config = DecodeConfig(6, ignore_eos=True)
    # on CUDA the kernels are also captured in the decode step's graph and replayed
    if policy.get("rows") == "TENSOR_ROWS":
        policy = {**policy, "rows": kernels.TENSOR_ROWS}
    launch = kernels.LaunchPolicy(**policy)
    engine = FastEngine(model, FastOptions(compile=False, graphs=DEVICE.type == "cuda", triton=True, launch=launch))
    assert "triton" in engine.describe()
    assert torch.equal(engine.run(prompt, config, None, HostClock()), generate(model, prompt, config).tokens)
    assert engine.cache.length == (context or 256)


def test_seeded_sampling_with_triton_kernels_draws_what_the_torch_step_draws(kernels, tiny):
    """Same logits (fp32) and the same uniform draws: the sampled tokens are identical."""
    from inferlab.model.registry import load_model
    from inferlab.decode.sampling import SamplingConfig

    model = tiny.model if DEVICE.type == "cpu" else load_model("tiny-random", DEVICE, torch.float32).model
    # 4 rows: the decode step's GEMVs in the tensor-core kernel (under the interpreter a fraction of
    # the time of one program per row); the sampling kernel takes one row a program at any batch
    prompt = random_prompt(model.config.vocab_size, 5, 4, torch.Generator().manual_seed(4), DEVICE)
    config = DecodeConfig(6, sampling=SamplingConfig(greedy=False, temperature=0.8, top_k=50, top_p=0.9), ignore_eos=True)
    graphs = DEVICE.type == "cuda"
    runs = []
    engines = []
    for triton, launch in ((True, kernels.LaunchPolicy(sampling="torch")), (True, None), (False, None),
                           (True, kernels.LaunchPolicy(sampling="kernel")), (True, kernels.LaunchPolicy(sampling="split"))):
        engines.append(FastEngine(model, FastOptions(compile=False, graphs=graphs, triton=triton, launch=launch)))
    for engine in engines[:3] + engines[4:]:
        runs.append(engine.run(prompt, config, torch.Generator(DEVICE).manual_seed(7), HostClock()))
    # The default named is prepared, not run: its policy is the default's, field for field, so its
    # launches, and its draws, are the default engine's (a second run would repeat the same computation).
    engines[3].prepare(prompt, config)
    assert engines[3].kernels.policy == engines[1].kernels.policy
    # the torch step, the default (one program a row), no Triton at all, the default named, and
    # the split kernel
    assert [engine._sample_kernel for engine in engines] == [False, True, False, True, True]
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    assert len(set(runs[0].flatten().tolist())) > 1


@pytest.mark.gpu
def test_on_cuda_the_compiled_sample_step_in_the_graph_draws_what_the_torch_step_draws():
    """On CUDA: Triton decode step, `sample_step` compiled by inductor (`LaunchPolicy(sampling=
    "torch")`), all replayed in a CUDA graph; fp32 logits and the same uniform draws give the same
    tokens as the eager ops; so do the defaults, the sampling kernel replayed in the graph."""
    from inferlab.model.registry import load_model
    from inferlab.decode.sampling import SamplingConfig

    model = load_model("tiny-random", DEVICE, torch.float32).model
    prompt = random_prompt(model.config.vocab_size, 5, 2, torch.Generator().manual_seed(4), DEVICE)
    config = DecodeConfig(8, sampling=SamplingConfig(greedy=False, temperature=0.7, top_p=0.9), ignore_eos=True)
    from inferlab.fast.kernels import LaunchPolicy

    runs = [FastEngine(model, options).run(prompt, config, torch.Generator(DEVICE).manual_seed(7), HostClock())
            for options in (FastOptions(launch=LaunchPolicy(sampling="torch")),
                            FastOptions(compile=False, graphs=False, triton=False), FastOptions(),
                            FastOptions(launch=LaunchPolicy(sampling="split")))]
    # the last two: the sampling kernels in the graph, the default (one program a row) and split
    assert all(torch.equal(runs[0], run) for run in runs[1:])


def test_triton_kernels_on_cpu_are_refused_with_a_reason(tiny, monkeypatch):
    from inferlab.errors import UsageError

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UsageError, match="Triton decode kernels need a CUDA device"):
        FastEngine(tiny.model, FastOptions(compile=False, graphs=False, triton=True))


@pytest.mark.gpu
@torch.inference_mode()
def test_dependent_launch_changes_the_timing_only(kernels):
    """The TinyLlama step's kernels chained with and without programmatic dependent launch, each
    captured in a CUDA graph and replayed over several positions: bit-identical logits and caches.
    A kernel that read its input before the previous kernel finished writing it would differ."""
    from inferlab.model.registry import load_model

    if not kernels.pdl_supported(DEVICE):
        pytest.skip("programmatic dependent launch needs a Hopper or later GPU")
    model = load_model("tinyllama-1.1b-random", DEVICE, torch.bfloat16).model
    results = []
    for pdl in (False, True):
        net = FastLlama(model)
        cache = net.new_cache(1, 64)
        ops = kernels.Kernels(pdl=pdl)
        hidden = F.embedding(torch.tensor([5], device=DEVICE), net.embed)
        position = torch.tensor([0], device=DEVICE)
        net.decode_hidden(hidden, position, cache, ops)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = net.decode_hidden(hidden, position, cache, ops)
        steps = []
        for step in range(8):
            position.fill_(step)
            hidden.copy_(net.embed[100 * step + 1])
            graph.replay()
            steps.append(logits.clone())
        results.append((torch.stack(steps), cache.k[:, :, :, :8].clone(), cache.v[:, :, :, :8].clone()))
        del net, graph
    for without, with_pdl in zip(*results):
        assert torch.equal(without, with_pdl)
    assert results[0][0].abs().max() > 0


def test_every_kernel_compiles_for_hopper_without_spilling():
    """What the interpreter cannot see: each kernel, in the shapes the engine launches, compiled
    by Triton for sm_90 (no GPU needed) with no spill to local memory. In a process without
    TRITON_INTERPRET, since under the interpreter nothing is compiled."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "inferlab.fast.aot", "--arch", "90"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    for kernel in ("_gemv_kernel", "_gemv_rows_kernel", "_gemv_tma_kernel", "_gemv_batch_kernel", "_attention_decode_kernel",
                   "_attention_split_kernel", "_attention_combine_kernel", "_attention_o_kernel", "_greedy_step_kernel",
                   "_sample_step_kernel"):
        assert any(kernel in line for line in lines), kernel
    assert all("local     0 B" in line and "spills in loops 0" in line for line in lines)
    # no spill at all, but for the sampling kernel's once after its loops (aot.SPILLS_ONCE)
    assert all("stack     0 B" in line for line in lines if "_sample_step_kernel" not in line)


def test_loop_spills_counts_the_spills_between_a_backward_branch_and_its_target():
    from inferlab.fast.aot import Compiled, loop_spills

    sass = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        /*0020*/                   FADD R3, R3, R4 ;
        /*0030*/                   LDL R5, [R1+0x4] ;
        /*0040*/               @P0 BRA 0x20 ;
        /*0050*/                   LDL R6, [R1] ;
        /*0060*/                   BRA 0x70 ;
    """
    assert loop_spills(sass) == 1  # the LDL at 0x30 repeats; the STL before the loop and the LDL after it do not
    once = Compiled("_sample_step_kernel", "c", 64, 0, 200, 0, 0)
    assert not once.spills and Compiled("_sample_step_kernel", "c", 64, 0, 200, 0, 1).spills
    assert Compiled("_gemv_kernel", "c", 64, 0, 8, 0, 0).spills

