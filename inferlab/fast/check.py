"""Is the fast engine as correct as the eager loop? Logits of both against an fp32 reference.

In bf16 neither engine equals fp32, and near-tied logits make free-running greedy sequences
diverge; so the fast engine is judged teacher-forced, on the eager loop's tokens: its error
against fp32 must be of the size of the eager loop's own.
"""

from __future__ import annotations

import copy

import torch

from inferlab.decode.loop import DecodeConfig, generate_steps
from inferlab.decode.prompts import Prompt
from inferlab.fast.engine import FastLlama
from inferlab.measure.clocks import clock_for, synchronize


def to_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    """The tokens up to and including the first EOS (all of them when none is an EOS)."""
    for index, token in enumerate(tokens):
        if token in eos:
            return tokens[: index + 1]
    return tokens


def agreement(ours: list[int], reference: list[int], eos: frozenset[int]) -> dict:
    """How far `ours` equals `reference`, both cut at the reference's first EOS: the reference's
    length there, the tokens equal from the start, and the first step that differs (None: none)."""
    wanted = to_eos(reference, eos)
    same = 0
    for mine, theirs in zip(ours, wanted):
        if mine != theirs:
            break
        same += 1
    return {"reference_tokens": len(wanted), "equal_tokens": same, "equal": same == len(wanted),
            "first_difference": None if same == len(wanted) else same}


def margin(logits: torch.Tensor, reference: list[int], ours: list[int], eos: frozenset[int]) -> dict | None:
    """Where `ours` first leaves `reference` (cut at its EOS): the step, both tokens, and how far
    the reference model's choice led there (`fp32_margin`, its logit minus that of ours), `logits`
    [N, V] being the reference model's logits at each of its steps. None where they do not part.

    A margin below the logit error of lower precision is a near-tie that rounding may break either
    way; a larger one means the two computations differ by more than rounding."""
    at = agreement(ours, reference, eos)["first_difference"]
    if at is None or at >= len(ours):
        return None
    return {"step": at, "reference_token": reference[at], "token": ours[at],
            "fp32_margin": (logits[at, reference[at]] - logits[at, ours[at]]).item()}


def reference_logits(model, prompt, tokens: torch.Tensor) -> torch.Tensor:
    """fp32 logits [B, N, V] for each generated position, teacher-forced on `tokens` [B, N]."""
    reference = copy.deepcopy(model).to(torch.float32)  # the same weights, upcast: the same function
    ids = torch.cat([prompt.input_ids, tokens[:, :-1]], dim=1)
    with torch.inference_mode():
        logits = reference(input_ids=ids).logits[:, prompt.length - 1 :].float()
    del reference
    if ids.device.type == "cuda":
        torch.cuda.empty_cache()
    return logits


def teacher_forced_check(loaded, prompt: Prompt, new_tokens: int, fast_engine) -> dict:
    """Greedy token agreement of fast vs eager, and each one's logit error against an fp32 reference.

    Both run in bf16, so neither equals fp32; the fast engine is as correct as the eager loop when
    its error against fp32 (on the same teacher-forced tokens) is of the same size as the eager
    loop's own.
    """
    config = DecodeConfig(new_tokens, ignore_eos=True)
    eager_steps = [(s.tokens.clone(), s.logits.clone()) for s in generate_steps(loaded.model, prompt, config)]
    eager_tokens = torch.stack([t for t, _ in eager_steps], dim=1)
    eager_logits = torch.stack([l for _, l in eager_steps], dim=1)  # [B, N, V]
    fast_engine.prepare(prompt, config)
    fast_tokens = fast_engine.run(prompt, config, None, clock_for(loaded.device, new_tokens))
    synchronize(loaded.device)
    same = (fast_tokens == eager_tokens)[0].tolist()
    first_divergence = same.index(False) if False in same else None
    # Teacher-forced: the fast model fed the eager tokens, its decode step through the same
    # Triton kernels as the engine's (or the torch step, uncompiled, when the engine compiles it).
    kernels = fast_engine.kernels  # the engine's own kernels and launch policy; None for the torch step
    net = FastLlama(loaded.model, sdpa=fast_engine.options.sdpa,
                    prefill_flash=fast_engine.options.prefill_attention == "flash",
                    slice_write=fast_engine.options.prefill_cache_write == "slice")
    cache = net.new_cache(prompt.batch_size, prompt.length + new_tokens)
    fast_logits = []
    with torch.inference_mode():
        fast_logits.append(net(prompt.input_ids, torch.arange(prompt.length, device=loaded.device), cache, fresh=True)[:, -1])
        for index in range(1, new_tokens):
            position = torch.tensor([prompt.length + index - 1], device=loaded.device)
            step_tokens = eager_tokens[:, index - 1 : index]
            if kernels is None:
                fast_logits.append(net(step_tokens, position, cache)[:, -1])
            else:
                fast_logits.append(net.decode(step_tokens, position, cache, kernels))
    fast_logits = torch.stack(fast_logits, dim=1)
    reference = reference_logits(loaded.model, prompt, eager_tokens)
    top1 = reference.argmax(-1)
    # Where fast and eager pick different tokens on the same inputs, how close was the race? The
    # fp32 gap between the two best logits there; next to the bf16 error above, a gap that small
    # is a near-tie that either engine may break either way.
    top2 = reference.topk(2, dim=-1).values
    gap = top2[..., 0] - top2[..., 1]
    differ = fast_logits.argmax(-1) != eager_logits.argmax(-1)
    # Where the free-running sequences part (row 0), both have seen the same tokens: how far apart
    # does fp32 hold the two tokens they picked there? Below the bf16 error, a near-tie.
    eager_row, fast_row = eager_tokens[0].tolist(), fast_tokens[0].tolist()
    parted = margin(reference[0], eager_row, fast_row, frozenset())
    return {
        "eager_tokens": eager_row,  # row 0's free-running tokens, as each engine chose them
        "fast_tokens": fast_row,
        "greedy_token_agreement_fast_vs_eager": sum(same) / len(same),
        "first_divergence_step": first_divergence,
        "fp32_gap_where_free_running_parts": None if parted is None else abs(parted["fp32_margin"]),
        "max_abs_logit_diff_fast_vs_eager": (fast_logits - eager_logits).abs().max().item(),
        "max_abs_logit_err_eager_vs_fp32": (eager_logits - reference).abs().max().item(),
        "max_abs_logit_err_fast_vs_fp32": (fast_logits - reference).abs().max().item(),
        "mean_abs_logit_err_eager_vs_fp32": (eager_logits - reference).abs().mean().item(),
        "mean_abs_logit_err_fast_vs_fp32": (fast_logits - reference).abs().mean().item(),
        "top1_agreement_eager_vs_fp32": (eager_logits.argmax(-1) == top1).float().mean().item(),
        "top1_agreement_fast_vs_fp32": (fast_logits.argmax(-1) == top1).float().mean().item(),
        "max_abs_logit_fp32": reference.abs().max().item(),
        "teacher_forced_top1_agreement_fast_vs_eager": 1 - differ.float().mean().item(),
        "max_fp32_top2_gap_where_fast_and_eager_differ": gap[differ].max().item() if differ.any() else None,
        "median_fp32_top2_gap": gap.median().item(),
    }
