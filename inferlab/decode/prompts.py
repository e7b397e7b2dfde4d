"""Prompts as token ids: from text (through the chat template when there is one) or random."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inferlab.errors import UsageError


@dataclass(frozen=True)
class Prompt:
    """Left-padded token ids [B, S] and their attention mask [B, S] (1 = real token, 0 = pad)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor

    def __post_init__(self) -> None:
        assert self.input_ids.shape == self.attention_mask.shape and self.input_ids.dim() == 2

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[1])


def from_ids(rows: list[list[int]], pad_token_id: int, device: torch.device) -> Prompt:
    """Left-pad rows of ids to one length."""
    if not rows or any(len(row) == 0 for row in rows):
        raise UsageError("empty prompt: give at least one token in every prompt")
    width = max(len(row) for row in rows)
    ids = [[pad_token_id] * (width - len(row)) + list(row) for row in rows]
    mask = [[0] * (width - len(row)) + [1] * len(row) for row in rows]
    return Prompt(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        attention_mask=torch.tensor(mask, dtype=torch.long, device=device),
    )


def encode_texts(tokenizer, texts: list[str], chat: bool = True) -> list[list[int]]:
    """Token ids of each text; wrapped as one user turn of the chat template when `chat` and one exists."""
    if tokenizer is None:
        raise UsageError("this model has no tokenizer (random weights): use --prompt-length N for random token ids")
    if not texts or any(not text.strip() for text in texts):
        raise UsageError("empty prompt: pass some text with --prompt")
    rows = []
    for text in texts:
        if chat and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            rows.append(tokenizer(text)["input_ids"])
    return rows


def from_texts(tokenizer, texts: list[str], device: torch.device, chat: bool = True) -> Prompt:
    """A left-padded batch from texts."""
    return from_ids(encode_texts(tokenizer, texts, chat), tokenizer.pad_token_id, device)


def random_prompt(
    vocab_size: int, length: int, batch_size: int, generator: torch.Generator, device: torch.device
) -> Prompt:
    """Uniform random ids in [3, vocab) (skipping the usual pad/bos/eos ids), no padding: [B, length]."""
    if length < 1:
        raise UsageError(f"prompt length must be at least 1, got {length}")
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1, got {batch_size}")
    ids = torch.randint(3, vocab_size, (batch_size, length), generator=generator, dtype=torch.long)
    return Prompt(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device))
