"""Engines side by side on one GPU, with the checks that make the numbers trustworthy.

    PYTHONPATH=. python3 perf_tests/scripts/engines_side_by_side.py --out results/engines

TinyLlama-1.1B architecture (random weights unless the real model is cached), bf16, batch 1,
prompt 128 random tokens, 128 new tokens, greedy, EOS ignored, CUDA events.

1. correctness: the fast engine's greedy tokens against the eager loop's over 128 tokens, and
   the largest logit difference of the fast model against transformers on the same tokens;
2. every engine timed (warm-up, then repeated runs; compile and capture timed apart);
3. the timer's own cost: per-token events against first/last-token events, interleaved;
4. event TPOT against one synchronized wall clock per request;
5. run-to-run spread of TPOT (p50 against p99 over the runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from inferlab.measure import fingerprint
from inferlab.measure import roofline
from inferlab.measure.bench import BenchConfig, build_prompt, decode_config, run_benchmark, run_once
from inferlab.decode.loop import DecodeConfig, generate_steps
from inferlab.decode.engines import make_engine
from inferlab.fast.engine import FastEngine, FastLlama, FastOptions
from inferlab.model.registry import default_model, load_model
from inferlab.measure.clocks import clock_for, synchronize
from inferlab.storage import new_run_folder, write_json_atomic


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


def correctness(loaded, prompt, new_tokens: int, fast_engine) -> dict:
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
    options = fast_engine.options
    kernels = None
    if options.triton:
        from inferlab.fast.kernels import Kernels

        kernels = Kernels(pdl=options.pdl)
    net = FastLlama(loaded.model, sdpa=options.sdpa)
    net.setup_cache(prompt.batch_size, prompt.length + new_tokens)
    fast_logits = []
    with torch.inference_mode():
        fast_logits.append(net(prompt.input_ids, torch.arange(prompt.length, device=loaded.device))[:, -1])
        for index in range(1, new_tokens):
            position = torch.tensor([prompt.length + index - 1], device=loaded.device)
            step_tokens = eager_tokens[:, index - 1 : index]
            if kernels is None:
                fast_logits.append(net(step_tokens, position)[:, -1])
            else:
                fast_logits.append(net.decode(step_tokens, position, kernels))
    fast_logits = torch.stack(fast_logits, dim=1)
    reference = reference_logits(loaded.model, prompt, eager_tokens)
    top1 = reference.argmax(-1)
    # Where fast and eager pick different tokens on the same inputs, how close was the race? The
    # fp32 gap between the two best logits there; next to the bf16 error above, a gap that small
    # is a near-tie that either engine may break either way.
    top2 = reference.topk(2, dim=-1).values
    gap = top2[..., 0] - top2[..., 1]
    differ = fast_logits.argmax(-1) != eager_logits.argmax(-1)
    return {
        "greedy_token_agreement_fast_vs_eager": sum(same) / len(same),
        "first_divergence_step": first_divergence,
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


def timer_cost(loaded, engine, pairs: int, prompt_length: int, new_tokens: int) -> dict:
    """Median TPOT with per-token events and with first/last events only, runs interleaved."""
    config = BenchConfig(engine=engine.name, prompt_length=prompt_length, output_length=new_tokens)
    prompt, decode = build_prompt(loaded, config), decode_config(loaded, config)
    engine.prepare(prompt, decode)
    per_token = clock_for(loaded.device, new_tokens, per_token=True)
    endpoints = clock_for(loaded.device, new_tokens, per_token=False)
    for _ in range(3):
        run_once(engine, prompt, decode, None, per_token, loaded.device)
    a, b, wall_gaps = [], [], []
    for _ in range(pairs):
        run = run_once(engine, prompt, decode, None, per_token, loaded.device)
        a.append(run.tpot_ms)
        wall_tpot = (run.wall_ms - run.ttft_ms) / (run.num_tokens - 1)
        wall_gaps.append(abs(wall_tpot - run.tpot_ms) / run.tpot_ms)
        b.append(run_once(engine, prompt, decode, None, endpoints, loaded.device).tpot_ms)
    return {
        "engine": engine.name,
        "pairs": pairs,
        "tpot_ms_per_token_events_p50": float(np.median(a)),
        "tpot_ms_endpoint_events_p50": float(np.median(b)),
        "relative_cost": float(np.median(a) / np.median(b) - 1),
        "wall_vs_events_max_rel_gap": float(max(wall_gaps)),
        "wall_vs_events_median_rel_gap": float(np.median(wall_gaps)),
        "raw_per_token": a,
        "raw_endpoints": b,
    }


VARIANTS = [
    ("hf", None),
    ("hf-static", None),
    ("eager", None),
    ("fast: graphs, eager torch kernels (fast-nocompile)", FastOptions(compile=False, graphs=True, triton=False)),
    ("fast: step compiled, inductor default mode + graphs",
     FastOptions(compile=True, graphs=True, triton=False, compile_mode="default")),
    ("fast: step compiled, max-autotune + graphs (fast-inductor)", FastOptions(compile=True, graphs=True, triton=False)),
    ("fast: Triton kernels, no PDL + graphs", FastOptions(graphs=True, triton=True, pdl=False)),
    ("fast: Triton kernels with PDL + graphs (default)", FastOptions()),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--output-length", type=int, default=128)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--variants", default="all", help="comma-separated indexes into VARIANTS, or all")
    parser.add_argument("--skip-trust", action="store_true")
    parser.add_argument("--correctness-only", action="store_true", help="check the default fast engine, time nothing")
    parser.add_argument("--time-budget-s", type=float, default=0, help="stop starting new variants after this long")
    parser.add_argument("--device", default="cuda", help="cuda (the real run) or cpu (a smoke test, no graphs)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    script_start = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("engines_side_by_side: needs a CUDA device (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    out = new_run_folder(args.out, "engines")  # a new folder each run: nothing earlier is overwritten
    print(f"writing to {out}", flush=True)
    name = args.model or default_model(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    loaded = load_model(name, device, dtype)
    env = fingerprint.environment(device)
    bandwidth = roofline.device_bandwidth(device, env["device_name"], probe=True)
    print(f"{name} {str(dtype).removeprefix('torch.')} on {env['device_name']} | torch {env['torch']} | transformers {env['transformers']} | "
          f"CUDA {env['cuda']} | driver {env['driver']} | {dict(loaded.model.config.to_dict()).get('num_hidden_layers')} layers | copy bandwidth {bandwidth[0] / 1e9:.0f} GB/s", flush=True)

    config = BenchConfig(prompt_length=args.prompt_length, output_length=args.output_length)
    prompt = build_prompt(loaded, config)
    chosen = VARIANTS if args.variants == "all" else [VARIANTS[int(i)] for i in args.variants.split(",")]
    if device.type != "cuda":
        chosen = [(label, options) for label, options in chosen if options is None or not options.graphs]
        chosen.append(("fast: eager kernels, no graphs (CPU)", FastOptions(compile=False, graphs=False)))
    default_fast = FastEngine(loaded.model)
    start = time.perf_counter()
    check = correctness(loaded, prompt, args.output_length, default_fast)
    print(f"correctness (and compiling the default fast engine, {time.perf_counter() - start:.0f} s):", json.dumps(check), flush=True)
    if args.correctness_only:
        write_json_atomic(out / "engines.json", {"environment": env, "bandwidth": bandwidth, "correctness": check})
        return 0
    write_json_atomic(out / "correctness.json", {"environment": env, "bandwidth": bandwidth, "correctness": check})

    rows, results, engines = [], {}, {}
    for label, options in chosen:
        engine_name = label.split(":")[0]
        bench = BenchConfig(engine=engine_name, prompt_length=args.prompt_length, output_length=args.output_length,
                            warmup_runs=args.warmup, runs=args.runs)
        engine = None if options is None else (default_fast if options.resolved(device) == default_fast.options else FastEngine(loaded.model, options))
        engines[label] = engine
        start = time.perf_counter()
        try:
            result = run_benchmark(loaded, bench, bandwidth, engine=engine)
        except Exception as error:  # one variant failing must not hide the others' numbers
            print(f"{label}: FAILED {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)
            continue
        s = result.summary
        line = result.roofline_summary()
        rows.append((label, result.prepare_ms, s["ttft_ms"]["p50"], s["tpot_ms"]["p50"], s["tpot_ms"]["p99"],
                     s["decode_tokens_per_s"], 100 * line["fraction_of_peak"], s["output_tokens_per_s"]["p50"]))
        # every fast variant runs as engine "fast": the label and options say which one it was
        results[label] = {**result.to_dict(), "variant": label, "options": None if options is None else asdict(options)}
        write_json_atomic(out / f"variant-{len(results)}.json", results[label])  # kept if a later variant fails
        print(f"{label}: done in {time.perf_counter() - start:.0f} s, TPOT p50 {s['tpot_ms']['p50']:.3f} ms", flush=True)
        if args.time_budget_s and time.perf_counter() - script_start > args.time_budget_s:
            print("time budget reached: skipping the remaining variants", flush=True)
            break

    trust = []
    if not args.skip_trust:
        for engine in (make_engine("eager", loaded.model), default_fast):
            trust.append(timer_cost(loaded, engine, 10, args.prompt_length, args.output_length))
            print("timer:", json.dumps({k: v for k, v in trust[-1].items() if not k.startswith("raw")}), flush=True)
    write_json_atomic(out / "engines.json", {"environment": env, "bandwidth": bandwidth, "correctness": check,
                                             "results": results, "timer": trust})

    print()
    print("| engine | compile+capture ms | TTFT ms p50 | TPOT ms p50 | TPOT ms p99 | decode tok/s | % of copy bandwidth | output tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| {} | {:.0f} | {:.2f} | {:.3f} | {:.3f} | {:.0f} | {:.1f} | {:.0f} |".format(*row))
    floor = roofline.roofline(loaded.model, 1, prompt.length, args.output_length, bandwidth)
    print(f"| bandwidth limit ({floor.bytes_per_step / 1e9:.2f} GB/step at {bandwidth[0] / 1e9:.0f} GB/s) | | | "
          f"{floor.floor_tpot_ms():.3f} | | {1e3 / floor.floor_tpot_ms():.0f} | 100 | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
