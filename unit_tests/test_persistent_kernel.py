"""Every layer in one persistent kernel (`LaunchPolicy(persistent=True)`): the same function as the
per-layer operations, its tiles handed out to any number of programs, the layers' weights as
views of one stack a kind, the grid sized to what the GPU holds at once. On a CPU the kernel runs under Triton's interpreter,
one launch per phase; on CUDA in one launch with its grid barriers, in bf16 too."""

import pytest
import torch

from inferlab.decode.loop import DecodeConfig, generate
from inferlab.decode.prompts import random_prompt
from inferlab.fast import spec as decode_ops
from inferlab.fast.engine import FastEngine, FastLlama, FastOptions
from inferlab.measure.clocks import HostClock

pytest.importorskip("triton", reason="Triton is not installed (requirements/test.txt installs it)")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="module")
def kernels():
    from inferlab.fast import kernels as triton_ops

    return triton_ops


def model_on_device(tiny, dtype):
    from inferlab.model.registry import load_model

    return tiny.model if DEVICE.type == "cpu" else load_model("tiny-random", DEVICE, dtype).model


def filled_cache(net: FastLlama, length: int, position: int):
    """A cache with seeded keys and values at positions [0, position): what earlier steps wrote."""
    cache = net.new_cache(1, length)
    generator = torch.Generator().manual_seed(5)
    for tensor in (cache.k, cache.v):
        tensor[:, :, :, :position] = torch.randn(tensor[:, :, :, :position].shape, generator=generator).to(tensor)
    return cache


@pytest.mark.parametrize("programs", [1, 3, 8])
@pytest.mark.parametrize("position", [0, 5, 21])  # the first step; within one block of positions; past it
@pytest.mark.parametrize("tile_elements", [4096, 256])  # K in one block (the input read once); in two or more
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_the_layers_kernel_computes_what_the_per_layer_operations_compute(kernels, tiny, programs, position,
                                                                          tile_elements, dtype):
    """Any number of programs (one takes every tile; three and eight take them in turn, some none),
    every K in one block or in several, the new token's key and value written at `position`,
    attention over a cache of earlier positions (one block of 64, and past it)."""
    if DEVICE.type == "cuda" and dtype == torch.float32 and programs == 8:
        pytest.skip("covered at 1 and 3 programs")
    net = FastLlama(model_on_device(tiny, dtype), stacked=True)
    hidden = net.embed[7:8].clone()
    expected_cache, cache = filled_cache(net, 32, position), filled_cache(net, 32, position)
    operands = (net.stacks, cache.cos, cache.sin, torch.tensor([position], device=DEVICE))
    heads = (net.num_heads, net.num_kv_heads, net.eps)
    expected = decode_ops.decode_layers(hidden, *operands, expected_cache.k, expected_cache.v, *heads)
    ours = kernels.decode_layers(hidden, *operands, cache.k, cache.v, *heads, programs=programs,
                                 tile_elements=tile_elements)
    shapes = [kernels.tile_shape(n, k, programs, gated, tile_elements) for n, k, gated in
              ((net.stacks[0].shape[1], net.stacks[0].shape[2], False), (net.stacks[3].shape[1], net.stacks[3].shape[2], False))]
    assert all((columns >= k) == (tile_elements == 4096) for (_, columns), k in zip(shapes, (net.stacks[0].shape[2],
                                                                                         net.stacks[3].shape[2])))
    if dtype == torch.float32:  # the same sums in another order (a later layer's cache entries too)
        for got, want in ((ours, expected), (cache.k, expected_cache.k), (cache.v, expected_cache.v)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert not torch.equal(cache.k[:, :, :, position], filled_cache(net, 32, position).k[:, :, :, position])
    else:  # bf16 roundings that land on neighbouring values, as in test_triton_ops.assert_same_function
        assert ((ours.float() - expected.float()).norm() / expected.float().norm()) < 2**-7
    assert torch.equal(hidden, net.embed[7:8])  # the input is not written


def test_each_layers_weights_are_views_of_the_stacks(tiny):
    net = FastLlama(tiny.model, stacked=True)
    wqkv = net.stacks[0]
    assert wqkv.shape[0] == len(net.layers)
    for index, layer in enumerate(net.layers):
        for stack, weight in zip(net.stacks, layer.weights()):
            assert torch.equal(stack[index], weight) and weight.data_ptr() == stack[index].data_ptr()
    assert FastLlama(tiny.model).stacks is None


# a batch of more than one row keeps the per-layer kernels (over the stacks' views), as test_triton_ops
# runs them: 6 tokens, 4 rows (the tensor-core kernel, under the interpreter a fraction of the time of
# one program per row)
@pytest.mark.parametrize("batch, new_tokens", [(1, 12), (4, 6)])
def test_fast_engine_with_the_persistent_kernel_gives_the_eager_loops_tokens(kernels, tiny, batch, new_tokens):
    model = model_on_device(tiny, torch.float32)
    prompt = random_prompt(model.config.vocab_size, 6, batch, torch.Generator().manual_seed(3), DEVICE)
    config = DecodeConfig(new_tokens, ignore_eos=True)
    launch = kernels.LaunchPolicy(persistent=True)
    engine = FastEngine(model, FastOptions(compile=False, graphs=DEVICE.type == "cuda", triton=True, launch=launch))
    assert torch.equal(engine.run(prompt, config, None, HostClock()), generate(model, prompt, config).tokens)
    assert engine.net.stacks is not None
    if DEVICE.type == "cuda":
        assert kernels.barrier_errors(DEVICE) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="counts the interpreter's launches, one a phase")
def test_a_persistent_step_is_three_kernels(kernels, tiny, record_launches):
    """Under the interpreter each of the 5 L phases is a launch; on a GPU they are one kernel."""
    launched = record_launches(("_decode_layers_kernel", "_gemv_kernel", "_greedy_step_kernel"))
    net = FastLlama(tiny.model, stacked=True)
    cache = net.new_cache(1, 16)
    ops = kernels.Kernels(pdl=False, policy=kernels.LaunchPolicy(persistent=True))
    hidden = net.embed[3:4].clone()
    tokens, out = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)
    position = torch.tensor([5])
    logits = net.decode_hidden(hidden, position, cache, ops)
    ops.greedy_step(logits, net.embed, hidden, tokens, out, position, 5)
    phases = 5 * len(net.layers)
    assert launched == ["_decode_layers_kernel"] * phases + ["_gemv_kernel", "_greedy_step_kernel"]
    assert ops.policy.decode_kernels(len(net.layers), 16) == 3


@pytest.mark.parametrize("n, k, programs, gated, shape", [
    (960, 576, 132, False, (8, 1024)),  # SmolLM2's [q; k; v]: 120 tiles of 8 rows, one a program, K in one block
    (1536, 576, 132, True, (16, 128)),  # its [gate; up]: two halves of products kept
    (5632, 2048, 132, True, (64, 32)),  # TinyLlama's [gate; up]: the most rows, the fewest columns
    (40, 96, 3, False, (16, 128)),  # few programs; K rounded up to a power of two, in one block
    (576, 1536, 132, False, (8, 512)),  # SmolLM2's down: K too long for one block
    (16, 64, 132, False, (1, 64)),  # more programs than rows: one row a tile
])
def test_each_program_gets_at_most_one_tile_and_a_bounded_number_of_products(kernels, n, k, programs, gated, shape):
    rows, columns = kernels.tile_shape(n, k, programs, gated)
    assert (rows, columns) == shape
    assert -(-n // rows) <= programs or rows == 64
    one_block = columns >= k
    assert rows * columns * (2 if gated else 1) <= (8192 if one_block else 4096) or columns == 32


@pytest.mark.parametrize("per_sm, registers, warps, shared, expected", [
    (1, 255, 4, 0, 132),  # one program of 4 warps always fits
    (2, 128, 4, 0, 264),  # 2 x 128 threads x 128 registers = half the register file
    (2, 255, 4, 0, 264),  # 255 registers round to 256: two programs fill the register file exactly
    (4, 200, 4, 0, 264),  # 200 registers: two programs of 4 warps, not four
    (2, 64, 4, 160 * 1024, 132),  # shared memory for one only
])
def test_the_grid_holds_only_programs_that_fit_at_once(kernels, per_sm, registers, warps, shared, expected):
    assert kernels.resident_programs(132, per_sm, registers, warps, shared) == expected


def test_persistent_per_sm_must_be_positive(kernels):
    with pytest.raises(ValueError, match="persistent_per_sm"):
        kernels.LaunchPolicy(persistent=True, persistent_per_sm=0)
