"""Triton kernels for one decode step at small batch, implementing `inferlab.fast.spec`.

At batch 1 a decode step is a chain of matrix-vector products: the time is the time to read
the weights once, plus a fixed cost per kernel. These kernels cut both: each projection is
one kernel that reads its matrix exactly once with wide, coalesced loads, and carries the work
around it (RMSNorm before, SiLU*up or the residual add after) so that nothing else runs between
two projections except the attention kernel, which also does RoPE and the cache write. A layer
is five kernels (six where the attention runs over ranges of the context, merged by
`_attention_combine_kernel` or, with `LaunchPolicy(head_combine="last")`, by the last range to
finish: a cache longer than `head_whole_cache` positions, or read at more than `head_whole_rows`
rows, with more than one range; four with `LaunchPolicy(attention_o_cache=...)`, the attention
and o in one kernel, or with `LaunchPolicy(qkv_attention_cache=...)`, the [q; k; v] projection and
the attention in one launch); after the LM head, one more
picks the greedy token, fetches its embedding for the next step and advances the position
(`greedy_step`).

On Hopper and later GPUs the kernels are chained by programmatic dependent launch (PDL): each
one is launched while the previous one still runs, loads what does not depend on it (its first
weight tile; for attention the rotary tables and the first cache rows), and only then waits
for the previous kernel's results (``gdc_wait``). The greedy step kernel is launched without
PDL, so every decode step starts after the previous step has completely finished.

From ROWS_MIN_BATCH batch rows on, the projections run `_gemv_rows_kernel` instead: small matrix
products on the tensor cores that read each weight tile once for the whole batch; or, with
`LaunchPolicy(batched="stream")`, `stream._gemv_stream_kernel`, the same products with each matrix's work
cut evenly between a fixed number of programs (stream-K); with `LaunchPolicy(batched="tma")`,
`tma._gemv_tma_kernel`, the same products with the weight tiles copied by the tensor memory
accelerator and K split to fill the GPU.

Launch shapes (rows per program, K-tile, warps, pipelining depth) come from `gemv_config`,
measured per matrix shape on an H200 by ``perf_tests/scripts/kernel_configs.py``; other shapes
get the default row. Importing this package needs Triton; `inferlab.fast.engine` imports it only for
CUDA (or under ``TRITON_INTERPRET=1``, which runs the kernels on the CPU for tests).

Modules: `policy` (launch shapes and `LaunchPolicy`, plain data), `launch` (PDL, kept buffers),
`tiles` (the loads and products the projections share), `projections`, `stream`, `tma`, `attention`,
`attention_fused` (a layer's attention and o projection in one kernel, `LaunchPolicy(attention_o_cache=...)`),
`projection_attention` (a layer's [q; k; v] projection and attention in one launch,
`LaunchPolicy(qkv_attention_cache=...)`),
`step` (the kernels and their launches), `persistent` (every layer of a batch-1 step in one
kernel, `LaunchPolicy(persistent=True)`); `Kernels` below binds them to one launch mode and
policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferlab.fast.kernels.attention import (attention_decode, attention_decode_split, attention_splits,
                                             combine_chunk)
from inferlab.fast.kernels.attention_fused import attention_o
from inferlab.fast.kernels.launch import KEPT, kept, multiprocessors, pdl_supported
from inferlab.fast.kernels.policy import (ATTENTION_BLOCK_T, ATTENTION_KERNELS, DEFAULT_GEMV, DEFAULT_POLICY,
                                          GREEDY_BLOCK_V, GREEDY_WARPS, MAX_SPLITS, MEASURED_GEMV, MEASURED_ROWS,
                                          ROWS_GEMV, SAMPLE_CANDIDATES, SMOLLM2_GEMV, SPLIT_BLOCK_T, SPLIT_COMBINES,
                                          STREAM_GEMV, TENSOR_ROWS, TMA_GEMV, TMA_HEAD,
                                          SPLIT_POLICY, SPLIT_POSITIONS, TINYLLAMA_GEMV, LaunchConfig, LaunchPolicy,
                                          RowsLaunch, gemv_config)
from inferlab.fast.kernels.grid import barrier_errors
from inferlab.fast.kernels.persistent import decode_layers, resident_programs, tile_shape
from inferlab.fast.kernels.projections import batch_config, gemv, rows_split_k
from inferlab.fast.kernels.projection_attention import qkv_attention
from inferlab.fast.kernels.sampling import CHUNK as SPLIT_CHUNK
from inferlab.fast.kernels.sampling import sample_step_split, split_fits, split_phases, split_programs
from inferlab.fast.kernels.step import SAMPLE_MAX_VOCAB, greedy_step, sample_kernel_fits, sample_step, sample_warps
from inferlab.fast.kernels.tiles import rms_columns

__all__ = [
    "ATTENTION_BLOCK_T", "ATTENTION_KERNELS", "DEFAULT_GEMV", "DEFAULT_POLICY", "GREEDY_BLOCK_V", "GREEDY_WARPS",
    "KEPT", "MAX_SPLITS", "MEASURED_GEMV", "MEASURED_ROWS", "ROWS_GEMV", "SAMPLE_CANDIDATES", "SAMPLE_MAX_VOCAB",
    "SMOLLM2_GEMV",
    "SPLIT_BLOCK_T", "SPLIT_COMBINES", "SPLIT_POLICY", "SPLIT_POSITIONS", "STREAM_GEMV", "TENSOR_ROWS", "TINYLLAMA_GEMV", "TMA_GEMV", "TMA_HEAD", "Kernels",
    "LaunchConfig", "LaunchPolicy", "RowsLaunch", "attention_decode", "attention_o", "attention_decode_split", "attention_splits",
    "barrier_errors", "batch_config", "combine_chunk", "decode_layers", "gemv", "gemv_config", "greedy_step",
    "kept", "multiprocessors", "pdl_supported", "qkv_attention", "resident_programs", "rms_columns", "rows_split_k",
    "sample_kernel_fits", "sample_step", "sample_step_split", "sample_warps", "SPLIT_CHUNK", "split_fits", "split_phases", "split_programs",
    "tile_shape",
]


@dataclass(frozen=True)
class Kernels:
    """These kernels with one launch mode and launch policy, usable wherever `inferlab.fast.spec` is."""

    pdl: bool | None = None
    policy: LaunchPolicy = DEFAULT_POLICY

    def gemv(self, *args, ahead: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        if self.policy.l2_ahead_from != "all":
            ahead = None
        return gemv(*args, pdl=self.pdl, policy=self.policy, ahead=ahead, **kwargs)

    def attention_decode(self, qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads,
                         ahead: torch.Tensor | None = None) -> torch.Tensor:
        operands = (qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
        policy = self.policy
        if policy.attention_for(k_cache.shape[2]) == "split":
            splits = attention_splits(k_cache.shape[2], policy.split_positions, policy.max_splits)
            return attention_decode_split(*operands, block_t=policy.split_block_t, splits=splits, pdl=self.pdl,
                                          combine=policy.split_combine)
        block_t, range_positions, warps = policy.head_launch_for(k_cache.shape[2], qkv.shape[0])
        return attention_decode(*operands, block_t=block_t, pdl=self.pdl, range_positions=range_positions,
                                combine=policy.head_combine, ahead=ahead, ahead_limit=policy.l2_ahead,
                                num_warps=warps)

    def attention_o(self, qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads, wo, residual,
                    ahead: torch.Tensor | None = None, ahead_gated: bool = False) -> torch.Tensor:
        """A layer's attention and o projection: one kernel where the policy fuses them
        (`LaunchPolicy.attention_o_for`), else the attention kernel(s) and o's projection."""
        policy = self.policy
        operands = (qkv, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
        if policy.attention_o_for(k_cache.shape[2], qkv.shape[0]):
            return attention_o(*operands, wo, residual, block_n=policy.attention_o_block_n,
                               block_t=policy.attention_o_block_t,
                               num_warps=policy.attention_o_warps, registers=policy.attention_o_registers,
                               pdl=self.pdl)
        attended = self.attention_decode(*operands, ahead=wo)
        return self.gemv(attended, wo, residual=residual, ahead=ahead, ahead_gated=ahead_gated)

    def qkv_attention_config(self, x, wqkv, k_cache, num_heads, num_kv_heads) -> LaunchConfig | None:
        """The projection's launch shape where the policy runs this layer's [q; k; v] projection
        and attention as one launch (`LaunchPolicy.qkv_attention_launch`), else None."""
        return self.policy.qkv_attention_launch(wqkv.shape[0], x.shape[1], x.shape[0], k_cache.shape[2], num_heads,
                                                num_kv_heads, k_cache.shape[-1])

    def qkv_attention(self, x, wqkv, attn_norm, eps, cos, sin, position, k_cache, v_cache, num_heads,
                      num_kv_heads) -> torch.Tensor:
        """A layer's [q; k; v] projection and attention: one launch where the policy fuses them,
        else the projection and the attention kernel(s)."""
        operands = (cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
        config = self.qkv_attention_config(x, wqkv, k_cache, num_heads, num_kv_heads)
        if config is None:
            return self.attention_decode(self.gemv(x, wqkv, norm=attn_norm, eps=eps), *operands)
        return self._fused_qkv_attention(config, x, wqkv, attn_norm, eps, *operands)

    def _fused_qkv_attention(self, config: LaunchConfig, *args) -> torch.Tensor:
        policy = self.policy
        return qkv_attention(*args, config=config, block_t=policy.qkv_attention_block_t,
                             registers=policy.qkv_attention_registers, early=policy.early_loads, pdl=self.pdl)

    def attention_block(self, x, wqkv, attn_norm, eps, cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads,
                        wo, ahead: torch.Tensor | None = None, ahead_gated: bool = False) -> torch.Tensor:
        """A layer's first half, x + o(attention([q; k; v](RMSNorm(x)))): the projection and the
        attention in one launch where the policy fuses them (`qkv_attention`), else the projection
        and `attention_o`."""
        operands = (cos, sin, position, k_cache, v_cache, num_heads, num_kv_heads)
        config = self.qkv_attention_config(x, wqkv, k_cache, num_heads, num_kv_heads)
        if config is None:
            qkv = self.gemv(x, wqkv, norm=attn_norm, eps=eps)
            return self.attention_o(qkv, *operands, wo, x, ahead=ahead, ahead_gated=ahead_gated)
        attended = self._fused_qkv_attention(config, x, wqkv, attn_norm, eps, *operands)
        return self.gemv(attended, wo, residual=x, ahead=ahead, ahead_gated=ahead_gated)

    def decode_layers(self, *args) -> torch.Tensor:
        return decode_layers(*args, per_sm=self.policy.persistent_per_sm)

    def greedy_step(self, *args, **kwargs) -> None:
        greedy_step(*args, **kwargs)

    def sample_fits(self, rows: int, vocab: int, device: torch.device) -> bool:
        """Whether the policy's sampling kernel takes `rows` rows of `vocab` logits on `device`
        (else a sampled step ends in the torch step)."""
        if self.policy.sampling == "kernel":
            return sample_kernel_fits(vocab)
        if self.policy.sampling == "split":
            return device.type != "cuda" or split_fits(rows, vocab, multiprocessors(device))
        return False

    def sample_step(self, *args, **kwargs) -> None:
        if self.policy.sampling == "split":
            sample_step_split(*args, **kwargs)
        else:
            sample_step(*args, **{"candidates": self.policy.sample_candidates, **kwargs})
