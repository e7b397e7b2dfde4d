"""What the clock costs: TPOT with an event per token against first/last events only, interleaved.

The per-token events are what TTFT, ITL and p99 need; this measures that they do not slow the
request they time, and that a synchronized wall clock agrees with the events.
"""

from __future__ import annotations

import numpy as np

from inferlab.decode.engines import Engine
from inferlab.measure.bench import BenchConfig, build_prompt, decode_config, run_once
from inferlab.measure.clocks import clock_for
from inferlab.model.registry import LoadedModel


def timer_cost(loaded: LoadedModel, engine: Engine, pairs: int, prompt_length: int, new_tokens: int) -> dict:
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
