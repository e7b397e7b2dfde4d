"""The one place that knows how a transformers model takes its KV cache.

transformers 5.17 names the forward keyword ``past_key_values``; later 5.x releases name it
``cache`` (and warn on the old name). Everything else in inferlab calls `forward`.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


@functools.lru_cache(maxsize=None)
def _cache_keyword(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def new_dynamic_cache(model) -> DynamicCache:
    """An empty cache that grows by one position per decoded token."""
    return DynamicCache(config=model.config)


def forward(model, input_ids, attention_mask, position_ids, cache, logits_to_keep: int = 1) -> torch.Tensor:
    """One forward pass that appends to `cache`; returns logits [B, logits_to_keep, V]."""
    keyword = _cache_keyword(type(model))
    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=logits_to_keep,
        **{keyword: cache},
    )
    return outputs.logits


def cached_length(cache) -> int:
    """Positions held in `cache` (per layer; all layers agree)."""
    return int(cache.get_seq_length())


def layer_kv_shapes(cache) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(key shape, value shape) of each layer: [B, KV heads, positions, head dim]."""
    return [(tuple(layer.keys.shape), tuple(layer.values.shape)) for layer in cache.layers]
