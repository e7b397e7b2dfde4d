"""A decoder's shape facts, derived from its config in one place: heads, head dim, KV bytes."""

from __future__ import annotations

import torch


def attention_heads(config) -> int:
    return int(config.num_attention_heads)


def kv_heads(config) -> int:
    """Key/value heads; a config without `num_key_value_heads` has one per query head (no GQA)."""
    return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)


def head_dim(config) -> int:
    """The per-head width: `head_dim` when the config sets it, else hidden_size / attention heads."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_position(config, dtype: torch.dtype) -> int:
    """K and V of one cached position of one sequence, all layers: 2 x layers x KV heads x head dim x bytes."""
    return 2 * int(config.num_hidden_layers) * kv_heads(config) * head_dim(config) * element_size(dtype)
