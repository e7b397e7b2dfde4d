"""A layer's [q; k; v] projection and attention in one launch (`inferlab.fast.kernels.projection_attention`):
the specification's function and cache write, every launch (the counts back at 0, no wait given
up), the launch policy that picks it, and the step trace."""

import pytest
import torch

from inferlab.fast import spec as decode_ops

pytest.importorskip("triton", reason="Triton is not installed (requirements/test.txt installs it)")

from test_triton_ops import (DEVICE, DTYPES, assert_same_function, attention_inputs, draw, kernels,  # noqa: E402,F401
                             traced_step)


def layer_inputs(M, heads, kv_heads, hd, T, hidden, dtype):
    """x [M, hidden], [q; k; v]'s weight and its norm's, then the RoPE tables and caches of
    `attention_inputs`, from fixed seeds."""
    _, cos, sin, k_cache, v_cache = attention_inputs(M, heads, kv_heads, hd, T, dtype)
    x = draw(M, hidden, dtype=dtype, seed=11)
    wqkv = draw((heads + 2 * kv_heads) * hd, hidden, dtype=dtype, seed=12, scale=0.3)
    norm = 1.0 + draw(hidden, dtype=dtype, seed=13, scale=0.1)
    return x, wqkv, norm, cos, sin, k_cache, v_cache


def wait_errors():
    from inferlab.fast.kernels.grid import barrier_errors

    return barrier_errors(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
# rows a program: 2 (as TinyLlama's launch), 8, a whole head of 16; K in one tile, in two, masked (48 in 32s)
@pytest.mark.parametrize("block_n, block_k, hidden", [(2, 64, 64), (8, 32, 64), (16, 32, 48)])
@pytest.mark.parametrize("block_t", [16, 4])  # the cache's first positions before the wait: all; 4, the rest after
@pytest.mark.parametrize("M, heads", [(1, 4), (2, 6)])  # GQA groups of 2; two rows in groups of 3
def test_the_launch_projects_then_attends_as_specified_and_writes_the_cache(kernels, dtype, block_n, block_k, hidden,
                                                                             block_t, M, heads):
    kv_heads, hd, T = 2, 16, 16
    x, wqkv, norm, cos, sin, k_cache, v_cache = layer_inputs(M, heads, kv_heads, hd, T, hidden, dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    errors = wait_errors()
    for position in (0, 9, T - 1):  # no cached position; some; all but the new one
        at = torch.tensor([position], device=DEVICE)
        expected = decode_ops.qkv_attention(x, wqkv, norm, 1e-5, cos, sin, at, expected_k, expected_v, heads, kv_heads)
        ours = kernels.qkv_attention(x, wqkv, norm, 1e-5, cos, sin, at, k_cache, v_cache, heads, kv_heads,
                                     config=kernels.LaunchConfig(block_n, block_k, 4, 1), block_t=block_t)
        assert_same_function(ours, expected)
        assert_same_function(k_cache, expected_k)
        assert_same_function(v_cache, expected_v)
        x = x.roll(1, dims=1)  # another token
    counts = [buffers[0] for key, buffers in kernels.KEPT.items() if key[0] == "qkv-attention"]
    assert counts and all(int(c.abs().sum()) == 0 for c in counts)  # every launch leaves its counts at 0
    assert wait_errors() == errors  # no wait gave up


def test_each_attention_program_waits_for_its_own_kv_heads_rows(kernels):
    """The count a KV head's attention programs wait for is the number of projection programs
    whose rows are its query heads' q, its k and its v: with one head's rows a program, a KV head
    of G = 3 query heads waits for 5 programs, and at the end of the launch every count is back
    at 0. The output is the specification's, row by row."""
    M, heads, kv_heads, hd, T, hidden = 2, 6, 2, 16, 8, 32
    x, wqkv, norm, cos, sin, k_cache, v_cache = layer_inputs(M, heads, kv_heads, hd, T, hidden, torch.float32)
    at = torch.tensor([4], device=DEVICE)
    ours = kernels.qkv_attention(x, wqkv, norm, 1e-5, cos, sin, at, k_cache.clone(), v_cache.clone(), heads, kv_heads,
                                 config=kernels.LaunchConfig(16, 32, 4, 1))
    for m in range(M):
        alone = decode_ops.qkv_attention(x[m:m + 1], wqkv, norm, 1e-5, cos, sin, at, k_cache[m:m + 1].clone(),
                                         v_cache[m:m + 1].clone(), heads, kv_heads)
        assert_same_function(ours[m:m + 1], alone)
    counts = [buffers[0] for key, buffers in kernels.KEPT.items() if key[0] == "qkv-attention" and key[2] == M * kv_heads]
    assert len(counts) == 1 and counts[0].tolist() == [0] * (M * kv_heads)


def test_the_policy_fuses_projection_and_attention_within_its_cache_length_rows_and_shapes(kernels):
    policy = kernels.LaunchPolicy(qkv_attention_cache=16)
    shape = dict(num_heads=4, num_kv_heads=2, head_dim=16)
    n = (4 + 2 * 2) * 16
    assert policy.qkv_attention_launch(n, 64, 1, 16, **shape) == policy.gemv_config(n, 64, False)
    assert policy.qkv_attention_launch(n, 64, 1, 17, **shape) is None  # a longer cache
    assert policy.qkv_attention_launch(n, 64, 2, 16, **shape) is None  # more rows than qkv_attention_rows
    assert kernels.LaunchPolicy(qkv_attention_cache=16, qkv_attention_rows=2).qkv_attention_launch(n, 64, 2, 16, **shape)
    wide = kernels.LaunchPolicy(qkv_attention_cache=16, gemv={(n, 64, False): kernels.LaunchConfig(32, 64, 4, 1)})
    assert wide.qkv_attention_launch(n, 64, 1, 16, **shape) is None  # 32 rows a program span two heads
    assert policy.qkv_attention_launch(n + 16, 64, 1, 16, **shape) is None  # not [q; k; v] of these heads
    tensor = kernels.LaunchPolicy(qkv_attention_cache=16, qkv_attention_rows=8)
    assert tensor.qkv_attention_launch(n, 64, 4, 16, **shape) is None  # 4 rows run the batched kernel
    assert kernels.DEFAULT_POLICY.qkv_attention_launch(n, 64, 1, 1, **shape) is None  # off by default
    assert policy.decode_kernels(22, 16) == 22 * 4 + 2 and policy.decode_kernels(22, 16, batch=2) == 22 * 5 + 2
    with pytest.raises(ValueError, match="qkv_attention_cache must be 0 or more positions"):
        kernels.LaunchPolicy(qkv_attention_cache=-1)
    with pytest.raises(ValueError, match="qkv_attention_rows must be 1 or more"):
        kernels.LaunchPolicy(qkv_attention_rows=0)
    with pytest.raises(ValueError, match="qkv_attention_registers must be 0"):
        kernels.LaunchPolicy(qkv_attention_registers=-1)
    with pytest.raises(ValueError, match="qkv_attention_block_t must be a power of two, not 24"):
        kernels.LaunchPolicy(qkv_attention_block_t=24)


def test_a_layers_first_half_runs_the_fused_launch_where_the_policy_fuses_it(kernels, record_launches):
    launched = record_launches(("_qkv_attention_kernel", "_attention_decode_kernel", "_gemv_kernel"))
    heads, kv_heads, hd, hidden = 4, 2, 16, 64
    ops = kernels.Kernels(policy=kernels.LaunchPolicy(qkv_attention_cache=16, qkv_attention_block_t=8))
    wo = draw(hidden, heads * hd, seed=9, scale=0.2)
    for T in (16, 32):  # fused; then the projection, the attention and o's projection
        x, wqkv, norm, cos, sin, k_cache, v_cache = layer_inputs(1, heads, kv_heads, hd, T, hidden, torch.float32)
        at = torch.tensor([T - 3], device=DEVICE)
        expected = decode_ops.attention_block(x, wqkv, norm, 1e-5, cos, sin, at, k_cache.clone(), v_cache.clone(),
                                              heads, kv_heads, wo)
        ours = ops.attention_block(x, wqkv, norm, 1e-5, cos, sin, at, k_cache, v_cache, heads, kv_heads, wo)
        assert_same_function(ours, expected)
    assert launched == ["_qkv_attention_kernel", "_gemv_kernel", "_gemv_kernel", "_attention_decode_kernel",
                        "_gemv_kernel"]


def test_the_step_trace_shows_projection_and_attention_as_one_launch_where_the_policy_fuses_them(kernels, tiny):
    fused_calls, fused, layers = traced_step(kernels, tiny, kernels.LaunchPolicy(qkv_attention_cache=16))
    calls, default, _ = traced_step(kernels, tiny, kernels.DEFAULT_POLICY)
    assert [call.kernel for call in fused_calls] == ["qkv_attention", "gemv", "gemv", "gemv"] * layers + ["gemv"]
    assert [call.kernel for call in calls] == ["gemv", "attention_decode", "gemv", "gemv", "gemv"] * layers + ["gemv"]
    fused_layers = [call for call in fused_calls if call.kernel == "qkv_attention"]
    assert [call.layer for call in fused_layers] == list(range(layers))
    assert all(call.role == "[q; k; v] projection and attention" and call.output == (1, 64) for call in fused_layers)
    torch.testing.assert_close(fused, default, rtol=1e-5, atol=1e-5)
