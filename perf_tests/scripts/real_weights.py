"""The fast engine on real weights: its greedy tokens against the eager loop's and `generate`'s.

    PYTHONPATH=. python3 perf_tests/scripts/real_weights.py --out results/real          # SmolLM2-135M on cuda
    PYTHONPATH=. python3 perf_tests/scripts/real_weights.py --out results/real --device cpu --model tiny-random
                                                                                        # a smoke test: the torch step

For each prompt (one chat turn each, batch 1; random ids for a model without a tokenizer):

- **fp32.** The fast engine's greedy tokens (its defaults on the device: on CUDA the Triton
  decode kernels, the compiled prefill, CUDA graphs), the eager loop's and `model.generate`'s,
  each compared with the eager loop's up to and including its first EOS. They must be equal.
- **bf16.** The same model in bf16: how far the fast engine's and the eager loop's free-running
  tokens agree with the fp32 tokens (up to the fp32 sequence's EOS), and each one's logit error
  against an fp32 reference on the same teacher-forced tokens (`inferlab.fast.check`). The fast
  engine's error must be of the size of the eager loop's own: at most `ERROR_FACTOR` times it,
  largest and mean. Where a bf16 sequence leaves the fp32 one, the fp32 model's margin there (its
  chosen token's logit minus the bf16 choice's, on the same prefix) says whether that was a
  near-tie that bf16 rounding may break either way: it must be within `ERROR_FACTOR` times the
  eager loop's largest bf16 error.

Writes `real.json` (every prompt's tokens and figures) in a new folder under --out, prints a
table, and exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from inferlab.decode.loop import DecodeConfig, eos_token_ids, generate_steps
from inferlab.decode.prompts import Prompt, from_texts, random_prompt
from inferlab.errors import UsageError
from inferlab.fast.check import agreement, margin, teacher_forced_check
from inferlab.fast.engine import FastEngine
from inferlab.measure.clocks import clock_for, synchronize
from inferlab.model.registry import load_model
from inferlab.storage import new_run_folder, writable_folder, write_json_atomic

PROMPTS = (
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Write a haiku about the sea.",
    "Explain in one sentence what a key-value cache is.",
    "List the first five prime numbers.",
)
ERROR_FACTOR = 2.0  # the fast engine's bf16 error against fp32, at most this many times the eager loop's


def prompts_for(loaded, count: int, length: int, device: torch.device) -> list[tuple[str, Prompt]]:
    """(label, prompt) pairs: one chat turn per text, or seeded random ids without a tokenizer."""
    if loaded.tokenizer is not None:
        return [(text, from_texts(loaded.tokenizer, [text], device)) for text in PROMPTS[:count]]
    vocab = loaded.model.config.vocab_size
    return [(f"random ids, seed {seed}", random_prompt(vocab, length, 1, torch.Generator().manual_seed(seed), device))
            for seed in range(count)]


@torch.inference_mode()
def greedy_tokens(loaded, prompt: Prompt, new_tokens: int, engine: FastEngine) -> tuple[dict[str, list[int]], torch.Tensor]:
    """Each engine's greedy tokens for one prompt (the fast engine's, the eager loop's, generate's),
    and the eager loop's logits at each of its steps [N, V] on the CPU."""
    config = DecodeConfig(new_tokens, ignore_eos=True)
    fast = engine.run(prompt, config, None, clock_for(loaded.device, new_tokens))
    synchronize(loaded.device)
    steps = [(s.tokens[0].item(), s.logits[0].float().cpu()) for s in generate_steps(loaded.model, prompt, config)]
    theirs = loaded.model.generate(input_ids=prompt.input_ids, attention_mask=prompt.attention_mask,
                                   max_new_tokens=new_tokens, do_sample=False,
                                   pad_token_id=pad_id(loaded))
    tokens = {"fast": fast[0].tolist(), "eager": [t for t, _ in steps], "generate": theirs[0, prompt.length:].tolist()}
    return tokens, torch.stack([l for _, l in steps])


def pad_id(loaded) -> int:
    """What `generate` pads a finished row with: the tokenizer's pad id, else the first EOS id."""
    pad = getattr(loaded.tokenizer, "pad_token_id", None) if loaded.tokenizer is not None else None
    return pad if pad is not None else (eos_token_ids(loaded.model.generation_config) or (0,))[0]


def fp32_rows(loaded, prompts, new_tokens: int) -> tuple[list[dict], list[torch.Tensor]]:
    """One row per prompt, and the eager loop's fp32 logits per prompt (for the bf16 margins)."""
    engine = FastEngine(loaded.model)
    eos = frozenset(eos_token_ids(loaded.model.generation_config))
    rows, logits = [], []
    for label, prompt in prompts:
        tokens, steps = greedy_tokens(loaded, prompt, new_tokens, engine)
        rows.append({"prompt": label, "prompt_tokens": prompt.length, "tokens": tokens,
                     "fast_vs_eager": agreement(tokens["fast"], tokens["eager"], eos),
                     "generate_vs_eager": agreement(tokens["generate"], tokens["eager"], eos)})
        logits.append(steps)
    return rows, logits


def bf16_rows(loaded, prompts, new_tokens: int, fp32: list[dict], fp32_logits: list[torch.Tensor]) -> list[dict]:
    engine = FastEngine(loaded.model)
    eos = frozenset(eos_token_ids(loaded.model.generation_config))
    rows = []
    for (label, prompt), reference, logits in zip(prompts, fp32, fp32_logits):
        check = teacher_forced_check(loaded, prompt, new_tokens, engine)  # runs both engines free too
        fast, eager = check.pop("fast_tokens"), check.pop("eager_tokens")
        wanted = reference["tokens"]["eager"]
        rows.append({"prompt": label, "tokens": {"fast": fast, "eager": eager},
                     "fast_vs_fp32": agreement(fast, wanted, eos), "eager_vs_fp32": agreement(eager, wanted, eos),
                     "fast_departs": margin(logits, wanted, fast, eos), "eager_departs": margin(logits, wanted, eager, eos),
                     "logits": check})
    return rows


def failures(fp32: list[dict], bf16: list[dict], factor: float = ERROR_FACTOR) -> list[str]:
    """One line per failed check; empty when every check holds."""
    found = []
    for row in fp32:
        for name in ("fast_vs_eager", "generate_vs_eager"):
            if not row[name]["equal"]:
                found.append(f"fp32 {name.replace('_vs_', ' vs ')} differs at token {row[name]['first_difference']} "
                             f"of {row[name]['reference_tokens']} on {row['prompt']!r}")
    for row in bf16:
        logits = row["logits"]
        bound = factor * logits["max_abs_logit_err_eager_vs_fp32"]
        departs = row.get("fast_departs")
        if departs is not None and departs["fp32_margin"] > bound:
            found.append(f"bf16 fast leaves the fp32 tokens at step {departs['step']}, where fp32 leads by "
                         f"{departs['fp32_margin']:.3f}: no near-tie (bound {bound:.3f}) on {row['prompt']!r}")
        for kind in ("max", "mean"):
            fast, eager = logits[f"{kind}_abs_logit_err_fast_vs_fp32"], logits[f"{kind}_abs_logit_err_eager_vs_fp32"]
            if fast > factor * eager:
                found.append(f"bf16 {kind} logit error against fp32 {fast:.4f}, over {factor}x the eager loop's "
                             f"{eager:.4f} on {row['prompt']!r}")
    return found


def table(fp32: list[dict], bf16: list[dict]) -> str:
    lines = ["| prompt | fp32 tokens to EOS | fast = eager | generate = eager | bf16 fast / eager = fp32 to EOS "
             "| fp32 margin where bf16 fast / eager leaves it | bf16 max logit error fast / eager | mean |",
             "|---|---|---|---|---|---|---|---|"]
    for a, b in zip(fp32, bf16):
        n = a["fast_vs_eager"]["reference_tokens"]
        logits = b["logits"]
        lines.append(
            f"| {a['prompt']} | {n} | {'yes' if a['fast_vs_eager']['equal'] else 'no'} "
            f"| {'yes' if a['generate_vs_eager']['equal'] else 'no'} "
            f"| {b['fast_vs_fp32']['equal_tokens']} / {b['eager_vs_fp32']['equal_tokens']} of {n} "
            f"| {departed(b.get('fast_departs'))} / {departed(b.get('eager_departs'))} "
            f"| {logits['max_abs_logit_err_fast_vs_fp32']:.3f} / {logits['max_abs_logit_err_eager_vs_fp32']:.3f} "
            f"| {logits['mean_abs_logit_err_fast_vs_fp32']:.4f} / {logits['mean_abs_logit_err_eager_vs_fp32']:.4f} |")
    return "\n".join(lines)


def departed(departs: dict | None) -> str:
    return "-" if departs is None else f"{departs['fp32_margin']:.3f} (step {departs['step']})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cuda", help="cuda (the real run) or cpu (a smoke test: the torch step)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many prompts, 1 to {len(PROMPTS)}")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-length", type=int, default=32, help="random ids a prompt, for a model without a tokenizer")
    args = parser.parse_args()
    if not 1 <= args.prompts <= len(PROMPTS) or args.new_tokens < 2 or args.prompt_length < 1:
        print(f"real_weights: --prompts must be 1 to {len(PROMPTS)}, --new-tokens at least 2 and --prompt-length at "
              f"least 1 (got {args.prompts}, {args.new_tokens}, {args.prompt_length})", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("real_weights: needs a CUDA device (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    try:
        writable_folder(args.out)  # checked before the work; the run's own folder is made when there is a result
        fp32_model = load_model(args.model, device, torch.float32)
        prompts = prompts_for(fp32_model, args.prompts, args.prompt_length, device)
        fp32, fp32_logits = fp32_rows(fp32_model, prompts, args.new_tokens)
        del fp32_model
        bf16_model = load_model(args.model, device, torch.bfloat16)
        bf16 = bf16_rows(bf16_model, prompts, args.new_tokens, fp32, fp32_logits)
        out = new_run_folder(args.out, "real")
    except UsageError as error:
        print(f"real_weights: {error}", file=sys.stderr)
        return 2
    failed = failures(fp32, bf16)
    write_json_atomic(out / "real.json", {"args": vars(args) | {"out": str(args.out)}, "error_factor": ERROR_FACTOR,
                                          "fp32": fp32, "bf16": bf16, "failed": failed})
    print(f"{args.model} on {device.type}: {len(prompts)} prompts, {args.new_tokens} new tokens, greedy; {out}")
    print(table(fp32, bf16))
    for line in failed:
        print(f"FAILED {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
