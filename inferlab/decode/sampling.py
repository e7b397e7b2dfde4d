"""Samplers: pure functions on logits, then one function that picks token ids.

Order, as in ``transformers``' ``generate``: temperature, then top-k, then top-p; then either
argmax (greedy) or one multinomial draw from softmax of the warped logits. Each warper takes
``logits[B, V]`` (float32) and returns new logits ``[B, V]`` with removed tokens set to -inf;
none modifies its input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. `greedy` ignores the other fields."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"`temperature` has to be a strictly positive float, but is {self.temperature}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k <= 0):
            raise ValueError(f"`top_k` has to be a strictly positive integer, but is {self.top_k}")
        if self.top_p is not None and not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"`top_p` has to be a float > 0 and <= 1, but is {self.top_p}")

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        parts = [f"temperature={self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top_k={self.top_k}")
        if self.top_p is not None:
            parts.append(f"top_p={self.top_p:g}")
        return "sample(" + ", ".join(parts) + ")"


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature: below 1 sharpens the distribution, above 1 flattens it."""
    return logits / temperature


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, and every logit tied with the k-th; -inf elsewhere."""
    k = min(k, logits.shape[-1])
    kth_value = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_value, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability sums to >= p (always at least one).

    Sorted ascending, a token is removed when the cumulative probability up to and including it
    is <= 1 - p; the most probable token is never removed.
    """
    sorted_logits, sorted_indices = torch.sort(logits, dim=-1, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_remove = cumulative <= (1.0 - p)
    sorted_remove[..., -1:] = False
    remove = sorted_remove.scatter(-1, sorted_indices, sorted_remove)
    return logits.masked_fill(remove, float("-inf"))


def warp(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Apply temperature, top-k and top-p, in that order, as `config` asks."""
    if config.temperature != 1.0:
        logits = apply_temperature(logits, config.temperature)
    if config.top_k is not None:
        logits = apply_top_k(logits, config.top_k)
    if config.top_p is not None and config.top_p < 1.0:
        logits = apply_top_p(logits, config.top_p)
    return logits


def select(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """Token ids [B] from logits [B, V]: argmax when greedy, else one draw from the warped softmax.

    `generator=None` draws from the global RNG, exactly as ``model.generate`` does.
    """
    if config.greedy:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(warp(logits.float(), config), dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
