"""The manual decode loop: prefill once, then one token per step reusing the KV cache.

The engine knows nothing about text, clocks or printing: it takes token ids and yields one
`Step` per generated token. Timing and inspection happen in whoever consumes the steps. With
``ignore_eos`` the loop never waits for the device; stopping at EOS needs one boolean read per
step, as in ``model.generate``.

Positions follow ``generate``: for a left-padded row, position = (number of real tokens
before it) - 1, pads get position 0, and each decode step adds one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from inferlab.decode import kvcache
from inferlab.decode.prompts import Prompt
from inferlab.decode.sampling import SamplingConfig, select


@dataclass(frozen=True)
class DecodeConfig:
    """What to generate: how many tokens, how to choose them, when to stop."""

    max_new_tokens: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    ignore_eos: bool = False
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"`max_new_tokens` has to be a positive integer, but is {self.max_new_tokens}")


def eos_token_ids(generation_config) -> tuple[int, ...]:
    """The ids that end a sequence: a generation config holds one id, a list of them, or none."""
    eos = generation_config.eos_token_id
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)


@dataclass(frozen=True)
class Step:
    """One generated token per row. Step 0 is the token chosen from the prefill's logits."""

    index: int
    tokens: torch.Tensor  # [B] long: ids chosen at this step (pad for rows already finished)
    logits: torch.Tensor  # [B, V] float32: the last position's logits they were chosen from
    seq_len: int  # positions in the KV cache after this step's forward pass
    cache: object  # the KV cache, for inspection; the loop keeps mutating it


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """position_ids [B, S] for a left-padded prompt: cumsum(mask) - 1, pads at 0."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def prefill(model, prompt: Prompt, cache) -> torch.Tensor:
    """Run the whole prompt through the model, filling `cache`; logits [B, V] (float32) of the last position."""
    positions = prompt_positions(prompt.attention_mask)
    logits = kvcache.forward(model, prompt.input_ids, prompt.attention_mask, positions, cache)
    return logits[:, -1, :].float()


def decode_one(model, tokens: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
    """One cached step: tokens [B] at positions [B] -> logits [B, V] (float32)."""
    logits = kvcache.forward(model, tokens[:, None], attention_mask, positions[:, None], cache)
    return logits[:, -1, :].float()


@torch.inference_mode()
def generate_steps(
    model,
    prompt: Prompt,
    config: DecodeConfig,
    generator: torch.Generator | None = None,
    cache=None,
) -> Iterator[Step]:
    """Yield one `Step` per generated token, at most `config.max_new_tokens` of them."""
    cache = kvcache.new_dynamic_cache(model) if cache is None else cache
    attention_mask = prompt.attention_mask
    positions = prompt_positions(attention_mask)[:, -1]
    eos = torch.tensor(config.eos_token_ids, device=prompt.input_ids.device, dtype=torch.long)
    stop_at_eos = not config.ignore_eos and eos.numel() > 0
    unfinished = torch.ones(prompt.batch_size, dtype=torch.bool, device=prompt.input_ids.device)

    logits = prefill(model, prompt, cache)
    seq_len = prompt.length
    for index in range(config.max_new_tokens):
        tokens = select(logits, config.sampling, generator)
        if stop_at_eos:
            tokens = torch.where(unfinished, tokens, config.pad_token_id)
            unfinished = unfinished & ~torch.isin(tokens, eos)
        yield Step(index=index, tokens=tokens, logits=logits, seq_len=seq_len, cache=cache)
        if index + 1 == config.max_new_tokens or (stop_at_eos and not bool(unfinished.any())):
            return
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(prompt.batch_size, 1)], dim=-1)
        positions = positions + 1
        logits = decode_one(model, tokens, attention_mask, positions, cache)
        seq_len += 1


@dataclass(frozen=True)
class Generation:
    """The generated ids [B, N]; rows that stopped early are padded with the pad id."""

    tokens: torch.Tensor
    prompt: Prompt

    @property
    def num_new_tokens(self) -> int:
        return int(self.tokens.shape[1])

    def sequences(self) -> torch.Tensor:
        """Prompt and generated ids together [B, S + N], as ``model.generate`` returns them."""
        return torch.cat([self.prompt.input_ids, self.tokens], dim=-1)


@torch.inference_mode()
def generate(
    model,
    prompt: Prompt,
    config: DecodeConfig,
    generator: torch.Generator | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> Generation:
    """Run the loop to the end, calling `on_step` after each token; return all generated ids."""
    tokens = []
    for step in generate_steps(model, prompt, config, generator):
        if on_step is not None:
            on_step(step)
        tokens.append(step.tokens)
    return Generation(tokens=torch.stack(tokens, dim=1), prompt=prompt)
