"""Each sampling kernel alone on the GPU's clock, and the split kernel's phases one by one.

    PYTHONPATH=. python3 perf_tests/scripts/sampling_kernels.py --out results/sampling

For each vocabulary (`--vocab`) and row count (`--rows`), fp32 logits spread like an LM head's
(a few tall ones over a broad base) and fresh uniform draws:

- the greedy step (`greedy_step`);
- for each sampling setting (temperature 0.7; with top-p 0.9; with top-k 50; with both): the
  kernel of one program a row (`sample_step`, where the vocabulary fits it; with top-p also by
  bisection alone, `candidates=0`, and with the draws rigged so that every candidate it checks
  first is outside the nucleus, its slowest path) and the split kernel
  (`sample_step_split`) in each shape of `--chunk` logits and `--warps` warps a program where
  its grid fits the GPU, their tokens checked against `inferlab.fast.engine.pick` on the same
  draws first;
- the split kernel's phases, each launched alone without barriers, after a whole launch has
  stored every phase's histograms. A phase alone is its pass over the logits plus the earlier
  phases' conclusions drawn again from their histograms: phase i alone minus phase i - 1 alone
  is what one more conclusion and the change of pass cost; the sum of the phases against the
  whole kernel bounds what the barriers add.

Each time is a CUDA graph of the launch replayed between CUDA events
(`inferlab.measure.graph_timing.time_per_launch_us`): no host launch cost in the figure.
Results in <out>/<time>-sampling/sampling.json. `--device cpu` runs the kernels under Triton's
interpreter and checks the tokens only (a smoke test: no times). Exit 0 when every kernel drew
the tokens `pick` draws, 1 when one did not or a grid barrier gave up waiting.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

SETTINGS = {
    "temperature 0.7": dict(temperature=0.7),
    "temperature 0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9),
    "temperature 0.7, top-k 50": dict(temperature=0.7, top_k=50),
    "temperature 0.8, top-k 50, top-p 0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
}


def inputs(rows: int, vocab: int, hidden: int, device: torch.device, seed: int = 0) -> dict:
    """Logits [rows, vocab] (a few tall ones over a broad base), uniform draws, the step's buffers."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator) * 2.0
    logits[:, :7] += torch.linspace(6.0, 3.0, 7)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return dict(logits=logits.to(device), uniform=torch.rand(rows, vocab, generator=generator).to(device),
                embed=torch.randn(vocab, hidden, generator=generator).to(device, dtype),
                hidden=torch.zeros(rows, hidden, device=device, dtype=dtype),
                tokens=torch.zeros(rows, 1, dtype=torch.long, device=device),
                # every launch of a step kernel advances the position and writes one column
                out=torch.zeros(rows, 1 << 16, dtype=torch.long, device=device),
                position=torch.zeros(1, dtype=torch.long, device=device))


def step_call(step, sampling, b: dict, **options):
    """One launch of a sampling kernel on the buffers `b` (the position as it stands)."""
    return lambda: step(b["logits"], sampling, b["uniform"], b["embed"], b["hidden"], b["tokens"], b["out"],
                        b["position"], 0, **options)


def draws_as_pick(call, sampling, b: dict) -> bool:
    """One launch from position 0: its tokens are the ones `pick` draws."""
    from inferlab.fast.engine import pick

    b["position"].zero_()
    call()
    return b["tokens"][:, 0].tolist() == pick(b["logits"], sampling, b["uniform"]).tolist()


def outside_first(logits: torch.Tensor, uniform: torch.Tensor, sampling, count: int) -> torch.Tensor:
    """The draws with each row's `count` likeliest tokens outside the nucleus (kept by top-k)
    brought to the front of the race (their draws 1 - 1e-7): the kernel of one program a row then
    checks that many candidates in vain and searches the threshold by bisection, its slowest path."""
    from dataclasses import replace

    from inferlab.decode.sampling import warp

    before = warp(logits, replace(sampling, top_p=None))  # temperature and top-k only
    outside = torch.isfinite(before) & ~torch.isfinite(warp(logits, sampling))
    chosen = torch.where(outside, before, float("-inf")).topk(count, dim=-1)
    rigged = uniform.clone()
    for row, (values, columns) in enumerate(zip(chosen.values, chosen.indices)):
        rigged[row, columns[torch.isfinite(values)]] = 1.0 - 1e-7
    return rigged


def timed_us(launches: list, b: dict, device: torch.device) -> float | None:
    """µs a launch, from position 0 (None off CUDA)."""
    if device.type != "cuda":
        return None
    from inferlab.measure.graph_timing import time_per_launch_us

    b["position"].zero_()
    return time_per_launch_us(launches, replays=20, repeats=5)


def measure(vocab: int, rows: int, hidden: int, device: torch.device, shapes: list[tuple[int, int]]) -> list[dict]:
    """Every kernel and setting for one vocabulary and row count, the split kernel in each
    (chunk, warps) of `shapes`, as rows of the results."""
    from inferlab.decode.sampling import SamplingConfig
    from inferlab.fast import kernels

    b = inputs(rows, vocab, hidden, device)
    found = []

    def record(**row) -> None:
        found.append({"vocab": vocab, "rows": rows, **row})
        us = "-" if row.get("us") is None else f"{row['us']:8.2f} us"
        print(f"V {vocab:6d} rows {rows:2d} | {row['setting']:38s} | {row['kernel']:24s} | {us} | "
              f"tokens {'as pick' if row.get('tokens_equal', True) else 'DIFFER'}", flush=True)

    greedy = lambda: kernels.greedy_step(b["logits"], b["embed"], b["hidden"], b["tokens"], b["out"], b["position"], 0)
    record(setting="greedy", kernel="greedy step", us=timed_us([greedy], b, device))
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1 << 20
    for name, keywords in SETTINGS.items():
        sampling = SamplingConfig(greedy=False, **keywords)
        if kernels.sample_kernel_fits(vocab):
            call = step_call(kernels.sample_step, sampling, b)
            equal = draws_as_pick(call, sampling, b)
            record(setting=name, kernel="one program a row", us=timed_us([call], b, device), tokens_equal=equal)
            if sampling.top_p is not None:
                # top-p by bisection alone; and by candidates where every one is outside the nucleus
                call = step_call(kernels.sample_step, sampling, b, candidates=0)
                equal = draws_as_pick(call, sampling, b)
                record(setting=name, kernel="one program a row, bisection", us=timed_us([call], b, device),
                       tokens_equal=equal)
                rigged = dict(b, uniform=outside_first(b["logits"], b["uniform"], sampling, kernels.SAMPLE_CANDIDATES))
                call = step_call(kernels.sample_step, sampling, rigged)
                equal = draws_as_pick(call, sampling, rigged)
                record(setting=name, kernel="one program a row, fallback", us=timed_us([call], rigged, device),
                       tokens_equal=equal)
        for chunk, warps in shapes:
            if not kernels.split_fits(rows, vocab, sms, chunk, warps):
                continue
            shape = dict(chunk=chunk, warps=warps)
            label = f"split {chunk}/{warps}w"
            call = step_call(kernels.sample_step_split, sampling, b, **shape)
            equal = draws_as_pick(call, sampling, b)
            record(setting=name, kernel=label, us=timed_us([call], b, device), tokens_equal=equal, **shape)
            for phase in range(kernels.split_phases(sampling, vocab)):  # the histograms of every phase are stored
                alone = step_call(kernels.sample_step_split, sampling, b, phases=[phase], **shape)
                record(setting=name, kernel=f"{label}, phase {phase} alone", us=timed_us([alone], b, device), **shape)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab", default="32000,49152", help="vocabularies, comma-separated")
    parser.add_argument("--rows", default="1,4", help="rows (the batch), comma-separated")
    parser.add_argument("--hidden", type=int, default=2048, help="the embedding rows' width")
    parser.add_argument("--chunk", default="1024", help="logits a program of the split kernel, comma-separated")
    parser.add_argument("--warps", default="4", help="warps a program of the split kernel, comma-separated")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (Triton's interpreter: the tokens, no times)")
    args = parser.parse_args()
    try:
        vocabularies, row_counts, chunks, warps = ([int(v) for v in text.split(",")]
                                                   for text in (args.vocab, args.rows, args.chunk, args.warps))
    except ValueError:
        print("sampling_kernels: --vocab, --rows, --chunk and --warps take comma-separated integers", file=sys.stderr)
        return 2
    if (min(vocabularies + row_counts) < 1 or any(c < 256 or c & (c - 1) for c in chunks)
            or any(w not in (1, 2, 4, 8, 16, 32) for w in warps)):
        print("sampling_kernels: --vocab and --rows must be positive, --chunk powers of two of at least 256, "
              "--warps powers of two up to 32", file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    elif not torch.cuda.is_available():
        print("sampling_kernels: needs a CUDA device (or --device cpu for a smoke test)", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    from inferlab.fast import kernels
    from inferlab.measure import fingerprint
    from inferlab.storage import new_run_folder, write_json_atomic

    out = new_run_folder(args.out, "sampling")  # a new folder each run: nothing earlier is overwritten
    env = fingerprint.environment(device)
    print(f"writing to {out}\n{env.get('device_name', args.device)} | torch {env['torch']}", flush=True)
    found = []
    for vocab in vocabularies:
        for rows in row_counts:
            found += measure(vocab, rows, args.hidden, device, [(c, w) for c in chunks for w in warps])
    barrier_errors = kernels.barrier_errors(device) if device.type == "cuda" else 0
    write_json_atomic(out / "sampling.json", {"environment": env, "barrier_errors": barrier_errors, "rows": found})
    if barrier_errors:
        print("sampling_kernels: a grid barrier gave up waiting (the split kernel's programs were not all resident): "
              "its times mean nothing", file=sys.stderr)
    if device.type != "cuda":
        print("(--device cpu only shows that every kernel runs and draws as pick does: no times)")
    return 0 if all(row.get("tokens_equal", True) for row in found) and not barrier_errors else 1


if __name__ == "__main__":
    sys.exit(main())
