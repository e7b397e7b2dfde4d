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
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from inferlab.measure import fingerprint
from inferlab.measure import roofline
from inferlab.measure.bench import BenchConfig, build_prompt, run_benchmark
from inferlab.decode.engines import make_engine
from inferlab.fast.engine import FastEngine, FastOptions
from inferlab.model.registry import default_model, load_model
from inferlab.storage import new_run_folder, write_json_atomic
from inferlab.fast.check import teacher_forced_check
from inferlab.measure.clock_cost import timer_cost


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
    check = teacher_forced_check(loaded, prompt, args.output_length, default_fast)
    print(f"correctness (and compiling the default fast engine, {time.perf_counter() - start:.0f} s):", json.dumps({k: v for k, v in check.items() if not k.endswith("_tokens")}), flush=True)  # the tokens: in the JSON
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
