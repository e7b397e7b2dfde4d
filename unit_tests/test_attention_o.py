"""A layer's attention and o projection in one kernel (`inferlab.fast.kernels.attention_fused`):
the specification's function and cache write, every launch (the arrival counts back at 0), and
the launch policy that picks it."""

import pytest
import torch

from inferlab.fast import spec as decode_ops

pytest.importorskip("triton", reason="Triton is not installed (requirements/test.txt installs it)")

from test_triton_ops import (DEVICE, DTYPES, assert_same_function, attention_inputs, draw,  # noqa: E402,F401
                             kernels, traced_step)  # kernels: the fixture


def layer_inputs(M, heads, kv_heads, hd, T, hidden, dtype):
    """`attention_inputs` (qkv, RoPE tables [T, hd], caches [M, kv_heads, T, hd]), then o's weight
    [hidden, heads hd] and the residual [M, hidden], from fixed seeds."""
    wo = draw(hidden, heads * hd, dtype=dtype, seed=9, scale=0.2)
    return (*attention_inputs(M, heads, kv_heads, hd, T, dtype), wo, draw(M, hidden, dtype=dtype, seed=10))


@pytest.mark.parametrize("dtype", DTYPES)
# one block of o's rows, masked (40 of 64); 3 blocks of 16, the last masked; blocks of 8
@pytest.mark.parametrize("hidden, block_n", [(40, 64), (40, 16), (64, 8)])
# the cache read whole before the wait; its first 4 positions there and the rest after, 4 at a time
@pytest.mark.parametrize("block_t", [16, 4])
@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("registers", [0, 64])  # 64: ptxas caps a thread's registers and spills the rest
def test_the_kernel_computes_attention_then_o_with_the_residual_and_writes_the_cache(kernels, dtype, hidden, block_n,
                                                                                      block_t, M, registers):
    heads, kv_heads, hd, T = 4, 2, 16, 16
    qkv, cos, sin, k_cache, v_cache, wo, residual = layer_inputs(M, heads, kv_heads, hd, T, hidden, dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for position in (0, 9, T - 1):  # no cached position; some; all but the new one
        at = torch.tensor([position], device=DEVICE)
        expected = decode_ops.attention_o(qkv, cos, sin, at, expected_k, expected_v, heads, kv_heads, wo, residual)
        ours = kernels.attention_o(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads, wo, residual,
                                   block_n=block_n, block_t=block_t, num_warps=4, registers=registers)
        assert_same_function(ours, expected)
        assert_same_function(k_cache, expected_k)
        assert torch.equal(v_cache, expected_v)
        qkv = qkv.roll(1, dims=1)  # another token
    counts = [buffers[1] for key, buffers in kernels.KEPT.items() if key[0] == "attention-o"]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)  # every launch leaves its counts at 0


def test_the_heads_partial_sums_are_added_in_head_order_whatever_the_arrival_order(kernels):
    """The last program of a block to arrive adds the heads' partial sums in head order: the same
    bits launch after launch; and the result is what each head's output times its columns of o,
    summed, gives."""
    heads, kv_heads, hd, T, hidden = 4, 1, 16, 8, 32
    qkv, cos, sin, k_cache, v_cache, wo, residual = layer_inputs(1, heads, kv_heads, hd, T, hidden, torch.float32)
    at = torch.tensor([5], device=DEVICE)
    first = kernels.attention_o(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads, wo, residual, block_n=16)
    again = kernels.attention_o(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads, wo, residual, block_n=16)
    assert torch.equal(first, again)
    attended = decode_ops.attention_decode(qkv, cos, sin, at, k_cache.clone(), v_cache.clone(), heads, kv_heads)
    per_head = [attended[:, h * hd:(h + 1) * hd] @ wo[:, h * hd:(h + 1) * hd].T for h in range(heads)]
    torch.testing.assert_close(first, residual + sum(per_head), rtol=1e-5, atol=1e-5)
    assert (first - residual).abs().max() > 0.1  # the projection is not lost in the residual


def test_the_policy_fuses_attention_and_o_up_to_its_cache_length_and_rows(kernels, record_launches):
    policy = kernels.LaunchPolicy(attention_o_cache=16)
    assert policy.attention_o_for(16, 1) and not policy.attention_o_for(17, 1) and not policy.attention_o_for(16, 2)
    assert kernels.LaunchPolicy(attention_o_cache=16, attention_o_rows=4).attention_o_for(8, 4)
    assert not kernels.DEFAULT_POLICY.attention_o_for(1, 1)  # off by default
    assert policy.decode_kernels(22, 16) == 22 * 4 + 2 and policy.decode_kernels(22, 16, batch=2) == 22 * 5 + 2
    for name, value in (("attention_o_block_n", 24), ("attention_o_block_t", 0), ("attention_o_warps", 3)):
        with pytest.raises(ValueError, match=f"{name} must be a power of two, not {value}"):
            kernels.LaunchPolicy(**{name: value})
    with pytest.raises(ValueError, match="attention_o_cache must be 0 or more positions"):
        kernels.LaunchPolicy(attention_o_cache=-1)
    with pytest.raises(ValueError, match="attention_o_registers must be 0"):
        kernels.LaunchPolicy(attention_o_registers=-1)
    launched = record_launches(("_attention_o_kernel", "_attention_decode_kernel", "_gemv_kernel"))
    heads, kv_heads, hd, hidden = 4, 2, 16, 32
    ops = kernels.Kernels(policy=kernels.LaunchPolicy(attention_o_cache=16, attention_o_block_n=16))
    for T in (16, 32):  # fused; one range of the attention kernel, then o's projection
        qkv, cos, sin, k_cache, v_cache, wo, residual = layer_inputs(1, heads, kv_heads, hd, T, hidden, torch.float32)
        at = torch.tensor([T - 3], device=DEVICE)
        expected = decode_ops.attention_o(qkv, cos, sin, at, k_cache.clone(), v_cache.clone(), heads, kv_heads, wo,
                                          residual)
        assert_same_function(ops.attention_o(qkv, cos, sin, at, k_cache, v_cache, heads, kv_heads, wo, residual), expected)
    assert launched == ["_attention_o_kernel", "_attention_decode_kernel", "_gemv_kernel"]


def test_the_step_trace_shows_attention_and_o_as_one_kernel_where_the_policy_fuses_them(kernels, tiny):
    fused_calls, fused, layers = traced_step(kernels, tiny, kernels.LaunchPolicy(attention_o_cache=16))
    calls, default, _ = traced_step(kernels, tiny, kernels.DEFAULT_POLICY)
    assert [call.kernel for call in fused_calls] == ["gemv", "attention_o", "gemv", "gemv"] * layers + ["gemv"]
    assert [call.kernel for call in calls] == ["gemv", "attention_decode", "gemv", "gemv", "gemv"] * layers + ["gemv"]
    fused_layers = [call for call in fused_calls if call.kernel == "attention_o"]
    assert all(call.role == "attention and o projection" and call.output == (1, 64) for call in fused_layers)
    torch.testing.assert_close(fused, default, rtol=1e-5, atol=1e-5)
