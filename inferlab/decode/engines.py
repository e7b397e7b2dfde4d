"""Decode engines: different ways to run the same generation, timed the same way.

Every engine follows `Engine`: `prepare` once per request shape (compilation and graph capture,
timed apart and never inside TPOT; a no-op for the eager loop and ``generate``), then `run`
per request. An engine's `run` starts the clock, issues the generation, calls ``clock.mark()`` right after
each token is issued, and returns the generated ids [B, N]. It never synchronizes; the clock
does, once, in ``finish()``.

- ``eager``: inferlab's manual loop (`decode.generate_steps`), dynamic KV cache.
- ``hf``: ``model.generate`` with its default dynamic cache.
- ``hf-static``: ``model.generate(cache_implementation="static")``; on CUDA it compiles the
  decode step, so its first runs are slow: warm up before timing.
- ``fast``: `inferlab.fast.engine`: fused Llama, static cache, CUDA graphs; on CUDA the decode step runs
  the hand-fused Triton kernels of `inferlab.fast.kernels` and the prefill is compiled.
- ``fast-split``: ``fast`` with the kernel variants still being measured: attention split over
  the context (flash-decoding) and split-K for the batched projections
  (`inferlab.fast.kernels.SPLIT_POLICY`); without Triton, the same as ``fast``.
- ``fast-inductor``: the same, with the whole decode step compiled by ``torch.compile``
  (max-autotune) instead of the Triton kernels: minutes of compiling.
- ``fast-nocompile``: graphs of eager torch kernels, nothing compiled: starts in well under a
  second.
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from inferlab.decode.loop import DecodeConfig, generate_steps
from inferlab.errors import UsageError
from inferlab.names import ENGINE_NAMES
from inferlab.decode.prompts import Prompt
from inferlab.measure.clocks import TokenClock


class Engine(Protocol):
    """What the measurement path needs of an engine."""

    name: str

    def prepare(self, prompt: Prompt, config: DecodeConfig) -> None:
        """Everything a request of this shape needs before it can be timed."""

    def run(self, prompt: Prompt, config: DecodeConfig, generator: torch.Generator | None, clock: TokenClock) -> torch.Tensor:
        """Generate config.max_new_tokens ids [B, N], marking `clock` after each token; never synchronizes."""


class EagerEngine:
    """The manual loop of `inferlab.decode.loop`."""

    name = "eager"

    def __init__(self, model) -> None:
        self.model = model

    def prepare(self, prompt: Prompt, config: DecodeConfig) -> None:
        """Nothing to build: the loop runs eagerly."""

    def run(self, prompt: Prompt, config: DecodeConfig, generator: torch.Generator | None, clock: TokenClock) -> torch.Tensor:
        tokens = []
        clock.start()
        for step in generate_steps(self.model, prompt, config, generator):
            clock.mark()
            tokens.append(step.tokens)
        return torch.stack(tokens, dim=1)


class _MarkEachToken(StoppingCriteria):
    """generate calls stopping criteria once per token, right after choosing it: mark there."""

    def __init__(self, clock: TokenClock) -> None:
        self.clock = clock

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        self.clock.mark()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class HFGenerateEngine:
    """``model.generate``, with its default cache or a static one."""

    def __init__(self, model, cache_implementation: str | None = None) -> None:
        self.model = model
        self.cache_implementation = cache_implementation
        self.name = "hf" if cache_implementation is None else f"hf-{cache_implementation}"

    def prepare(self, prompt: Prompt, config: DecodeConfig) -> None:
        """Nothing to build ahead: ``generate`` compiles a static cache's step on its first calls (warm up)."""

    def generate_kwargs(self, config: DecodeConfig) -> dict:
        sampling = config.sampling
        kwargs: dict = dict(max_new_tokens=config.max_new_tokens, pad_token_id=config.pad_token_id)
        if config.ignore_eos:
            kwargs["min_new_tokens"] = config.max_new_tokens  # the field's fixed-length convention
        if config.eos_token_ids:
            kwargs["eos_token_id"] = list(config.eos_token_ids)
        if sampling.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or 0)
            if sampling.top_p is not None:
                kwargs["top_p"] = sampling.top_p
        if self.cache_implementation is not None:
            kwargs["cache_implementation"] = self.cache_implementation
        return kwargs

    @torch.inference_mode()
    def run(self, prompt: Prompt, config: DecodeConfig, generator: torch.Generator | None, clock: TokenClock) -> torch.Tensor:
        kwargs = self.generate_kwargs(config)
        clock.start()
        sequences = self.model.generate(
            input_ids=prompt.input_ids,
            attention_mask=prompt.attention_mask,
            stopping_criteria=StoppingCriteriaList([_MarkEachToken(clock)]),
            **kwargs,
        )
        return sequences[:, prompt.length :]




def make_engine(name: str, model) -> Engine:
    """The engine called `name` for `model`."""
    if name == "eager":
        return EagerEngine(model)
    if name == "hf":
        return HFGenerateEngine(model)
    if name == "hf-static":
        return HFGenerateEngine(model, "static")
    if name in ("fast", "fast-split", "fast-inductor", "fast-nocompile"):
        from inferlab.fast.engine import FastEngine, FastOptions, triton_available

        split = None  # the kernels' module needs Triton; without it fast-split is fast
        if name == "fast-split" and triton_available():
            from inferlab.fast.kernels import SPLIT_POLICY as split
        options = {
            "fast": FastOptions(),
            "fast-split": FastOptions(launch=split),
            "fast-inductor": FastOptions(triton=False),
            "fast-nocompile": FastOptions(compile=False, triton=False),
        }[name]
        engine = FastEngine(model, options)
        engine.name = name
        return engine
    raise UsageError(f"unknown engine {name!r}: use one of {', '.join(ENGINE_NAMES)}")
