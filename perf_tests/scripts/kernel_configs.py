"""Launch shapes for the Triton decode kernels, measured on one GPU, and the decode step they make.

    PYTHONPATH=. python3 perf_tests/scripts/kernel_configs.py --out results/kernels

For each matrix of one TinyLlama-1.1B decode step (bf16, batch 1) it checks the kernel against
`inferlab.fast.spec` on random data, then times every candidate launch shape: the kernel is
captured in a CUDA graph once per copy of its weight, over enough copies that the weights
cannot sit in L2 (as in a real step, each matrix comes from device memory), and the graph is
replayed. Time per kernel = replay time / copies; bandwidth = weight bytes / time. cuBLAS
(`F.linear`, no fused norm or epilogue) is timed the same way for reference. Then the attention
kernel's tile over cached positions; where a step's time goes (the model's kernels replayed
alone with and without programmatic dependent launch, and the greedy step kernel against the
same work in torch ops); and finally the whole decode step (TPOT over 128 tokens after a
128-token prompt, prefill not compiled) with PDL off and on, and with the best shapes found
here when they differ from those in use.

    --no-gemv-probe   skip the projections' launch-shape search (the rest takes ~1 minute)
    --narrow          search only near the H200's best shapes
    --no-pdl          probe the kernels launched one after another
    --early-loads     probe and time the one-row kernel with `LaunchPolicy(early_loads=True)`
    --attention-variants
                      only the two attention kernels (one program per query head; split over
                      the context, `attention_decode_split`) alone at short and long contexts,
                      and the decode step with each at prompts 128 and 1920 (TTFT, TPOT and
                      prepare time with the prefill's attention as matmul + softmax or one fused
                      causal kernel, compiled as one graph or per layer, with dynamic shapes
                      or, "-static", for each shape)
    --probe-rows      only each projection alone at several batch sizes, with every batched kernel
    --batch-sizes     only the decode step at several batch sizes: one GEMV program per row
                      against the tensor-core batched kernel's launch shapes
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
import time
from dataclasses import replace
from types import MappingProxyType
from pathlib import Path

import torch
import torch.nn.functional as F

from inferlab.fast import spec as decode_ops
from inferlab.measure import fingerprint
from inferlab.measure import roofline
from inferlab.fast import kernels as ops
from inferlab.measure.bench import BenchConfig, run_benchmark
from inferlab.fast.engine import FastEngine, FastOptions
from inferlab.model import dims
from inferlab.model.registry import load_model
from inferlab.storage import new_run_folder, write_json_atomic
from inferlab.measure.graph_timing import graph_us, time_per_launch_us

def decode_matrices(config) -> list[tuple[str, int, int, str]]:
    """(name, N, K, kind): the five matrices of a Llama decode step, from its config. `gemv`
    launch shapes are keyed by (N, K, gated), so each model's shapes keep their own entries."""
    hidden, heads, kv = int(config.hidden_size), dims.attention_heads(config), dims.kv_heads(config)
    hd, inner = dims.head_dim(config), int(config.intermediate_size)
    return [("gate_up", inner, hidden, "gated"), ("down", hidden, inner, "residual"),
            ("lm_head", int(config.vocab_size), hidden, "logits"), ("qkv", (heads + 2 * kv) * hd, hidden, "norm"),
            ("o", hidden, heads * hd, "residual")]

# The full grid; `--narrow` keeps the neighbourhood of the shapes that won on an H200. Of the tiles
# wider than K only one of one tile is tried (`tile_fits`): the whole row of W loaded before the wait
# on the previous kernel. (1, 256), (1, 512) and (2, 256) give a small model's narrow matrices
# (SmolLM2: K = 576, N = 576 for o and down) enough programs to fill the GPU.
TILES = [(1, 256), (1, 512), (1, 1024), (1, 2048), (2, 256), (2, 512), (2, 1024), (2, 2048), (4, 256), (4, 512),
         (4, 1024), (8, 128), (8, 256), (8, 512), (16, 128), (16, 256), (32, 64), (32, 128)]
NARROW_TILES = [(1, 1024), (1, 2048), (2, 1024), (2, 2048), (4, 1024), (4, 2048)]
WARPS = [4, 8]
STAGES = [1, 3]
L2_ROTATION_BYTES = 512 * 2**20


def kwargs_for(kind: str, x: torch.Tensor, N: int) -> dict:
    norm = torch.randn(x.shape[1], device=x.device, dtype=x.dtype)
    return {
        "norm": dict(norm=norm, eps=1e-5),
        "gated": dict(norm=norm, eps=1e-5, gated=True),
        "residual": dict(residual=torch.randn(x.shape[0], N, device=x.device, dtype=x.dtype)),
        "logits": dict(norm=norm, eps=1e-5, out_dtype=torch.float32),
    }[kind]


def tile_fits(block_k: int, K: int) -> bool:
    """A K-tile worth trying for K columns: at most K, or the one power of two that holds K whole."""
    return block_k < 2 * K


def probe_shape(name: str, N: int, K: int, kind: str, device, bandwidth: float, deadline: float, tiles: list,
                pdl: bool, policy: ops.LaunchPolicy = ops.DEFAULT_POLICY) -> dict:
    gated = kind == "gated"
    rows = 2 * N if gated else N
    weight_bytes = rows * K * 2
    copies = max(2, math.ceil(L2_ROTATION_BYTES / weight_bytes))
    weights = [torch.randn(rows, K, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(1, K, device=device, dtype=torch.bfloat16)
    kwargs = kwargs_for(kind, x, N)
    expected = decode_ops.gemv(x, weights[0], **kwargs)
    got = ops.gemv(x, weights[0], policy=policy, **kwargs)
    error = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
    results = []
    for (bn, bk), warps, stages in itertools.product(tiles, WARPS, STAGES):
        if not tile_fits(bk, K) or time.perf_counter() > deadline:
            continue
        config = ops.LaunchConfig(bn, bk, warps, stages)
        try:
            us = time_per_launch_us([lambda w=w: ops.gemv(x, w, config=config, pdl=pdl, policy=policy, **kwargs)
                                     for w in weights])
        except Exception as error_:  # a shape the compiler rejects (registers, shared memory)
            print(f"  {name} {config}: {type(error_).__name__}", flush=True)
            continue
        results.append({"config": config.__dict__, "us": us, "gb_s": weight_bytes / us / 1e3})
    results.sort(key=lambda r: r["us"])
    cublas_weights = [w[:N] if gated else w for w in weights]
    cublas_us = time_per_launch_us([lambda w=w: F.linear(x, w) for w in cublas_weights])
    cublas_bytes = N * K * 2
    default_us = next((r["us"] for r in results if r["config"] == ops.DEFAULT_POLICY.default_gemv.__dict__), None)
    current = ops.gemv_config(N, K, gated).__dict__
    current_us = next((r["us"] for r in results if r["config"] == current), None)
    best = results[0] if results else None
    if best:
        print(f"{name:8s} N={N:6d} K={K:5d} {weight_bytes / 1e6:6.1f} MB | rel err {error:.1e} | best {best['config']} "
              f"{best['us']:.2f} us = {best['gb_s']:.0f} GB/s ({100 * best['gb_s'] * 1e9 / bandwidth:.0f}% of copy) | "
              f"in use {current} {current_us or float('nan'):.2f} us | default {default_us or float('nan'):.2f} us | cuBLAS {cublas_us:.2f} us = "
              f"{cublas_bytes / cublas_us / 1e3:.0f} GB/s for {'gate only' if gated else 'the plain product'}", flush=True)
    del weights
    torch.cuda.empty_cache()
    return {"name": name, "N": N, "K": K, "kind": kind, "weight_bytes": weight_bytes, "copies": copies,
            "relative_error_vs_spec": error, "results": results, "cublas_us": cublas_us, "cublas_bytes": cublas_bytes,
            "default_us": default_us, "in_use": current, "in_use_us": current_us, "pdl": pdl}


def rows_variants(rows: int, N: int, K: int, gated: bool) -> dict[str, ops.RowsLaunch]:
    """The batched projection kernels that can serve `rows` rows of an [N, K] matrix, as launches:
    one program per row; the CUDA-core kernel (up to its row limit) in its own launch shape and in
    the one-row kernel's (long tiles of few weight rows), and one row at a time (`rowwise`); the
    tensor-core kernel as it runs by default, with its first tile loaded before the wait, split
    over K to two programs per SM, and in narrower and wider tiles; the stream-K kernel and the
    TMA kernel in several tiles, at one and two programs per SM."""
    variants = {"per-row": ops.RowsLaunch("row")}
    if rows <= ops.DEFAULT_POLICY.cuda_max_rows:
        variants["cuda-core"] = ops.RowsLaunch("cuda")
        variants["cuda-core, one-row shape"] = ops.RowsLaunch("cuda", ops.gemv_config(N, K, gated))
    if rows <= ops.DEFAULT_POLICY.rowwise_max_rows:  # one row at a time, in the one-row kernel's shape
        variants["rowwise"] = ops.RowsLaunch("rowwise")
    variants.update({"tensor": ops.RowsLaunch("tensor"), "tensor prefetch": ops.RowsLaunch("tensor", prefetch=True),
                     "tensor split-K 264": ops.RowsLaunch("tensor", target_programs=264)})
    for label, config in ROWS_TILES.items():
        variants[f"tensor {label}"] = ops.RowsLaunch("tensor", config)
        variants[f"tensor {label} split-K 264"] = ops.RowsLaunch("tensor", config, target_programs=264)
    sms = ops.multiprocessors(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    for label, config in STREAM_TILES.items():  # stream-K: the work cut evenly, 1 or 2 programs per SM
        for per_sm in (1, 2):
            variants[f"stream {label} {per_sm}/SM"] = ops.RowsLaunch("stream", config, target_programs=per_sm * sms)
    variants["stream prefetch"] = ops.RowsLaunch("stream", ops.STREAM_GEMV, target_programs=2 * sms, prefetch=True)
    for label, config in TMA_TILES.items():  # weight tiles copied by the TMA, K split to 1 or 2 programs per SM
        for per_sm in (1, 2):
            variants[f"tma {label} {per_sm}/SM"] = ops.RowsLaunch("tma", config, target_programs=per_sm * sms)
    return variants


# the tensor-core kernel's tiles tried beside the default (`ROWS_GEMV`, 32 weight rows x 256)
ROWS_TILES = {"n16": ops.LaunchConfig(16, 256, 4, 4), "n64 k128": ops.LaunchConfig(64, 128, 4, 4)}


# the stream-K kernel's units: weight rows x columns, warps, stages (`STREAM_GEMV` first)
STREAM_TILES = {"n64 k128": ops.STREAM_GEMV, "n64 k128 s3": ops.LaunchConfig(64, 128, 4, 3),
                "n128 k128 s3": ops.LaunchConfig(128, 128, 4, 3), "n64 k256 s3": ops.LaunchConfig(64, 256, 4, 3),
                "n32 k256": ops.LaunchConfig(32, 256, 4, 4)}


# the TMA kernel's tiles: weight rows x columns, warps, stages (`TMA_GEMV` is "n64 k256 s3"; "n64 k128" its first build)
TMA_TILES = {"n64 k128": ops.LaunchConfig(64, 128, 4, 4), "n64 k128 s6": ops.LaunchConfig(64, 128, 4, 6),
             "n64 k256 s3": ops.TMA_GEMV, "n64 k256 s4": ops.LaunchConfig(64, 256, 4, 4),
             "n64 k256 s5": ops.LaunchConfig(64, 256, 4, 5), "n128 k128 s3": ops.LaunchConfig(128, 128, 4, 3),
             "n128 k64 s6": ops.LaunchConfig(128, 64, 4, 6), "n32 k256 s4": ops.LaunchConfig(32, 256, 4, 4),
             "n16 k256 s4": ops.LaunchConfig(16, 256, 4, 4)}


def rows_policy(N: int, K: int, gated: bool, rows: int, launch: ops.RowsLaunch) -> ops.LaunchPolicy:
    """The default policy with `launch` measured for this matrix at `rows` rows, and nothing else
    in its table, consulted from 2 rows: the policy that runs `launch` there."""
    key = ops.DEFAULT_POLICY.rows_key(N, K, gated, rows)
    return replace(ops.DEFAULT_POLICY, rows_min_batch=2, rows=MappingProxyType({key: launch}))


def probe_rows(name: str, N: int, K: int, kind: str, rows: int, device, bandwidth: float, pdl: bool,
               only: str | None = None) -> dict:
    """Each batched kernel (`rows_variants`) on one matrix at `rows` rows: checked against the
    specification, then timed with the weights rotated out of L2 as in `probe_shape`. A batch reads
    the weights once, so the bandwidth is weight bytes / time."""
    gated = kind == "gated"
    weight_bytes = (2 * N if gated else N) * K * 2
    copies = max(2, math.ceil(L2_ROTATION_BYTES / weight_bytes))
    weights = [torch.randn(2 * N if gated else N, K, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(rows, K, device=device, dtype=torch.bfloat16)
    kwargs = kwargs_for(kind, x, N)
    expected = decode_ops.gemv(x, weights[0], **kwargs).float()
    results = {}
    variants = {label: launch for label, launch in rows_variants(rows, N, K, gated).items()
                if only is None or re.search(only, label)}
    for label, launch in variants.items():
        policy = rows_policy(N, K, gated, rows, launch)
        try:
            got = ops.gemv(x, weights[0], policy=policy, pdl=pdl, **kwargs).float()
            us = time_per_launch_us([lambda w=w: ops.gemv(x, w, policy=policy, pdl=pdl, **kwargs) for w in weights])
        except Exception as error_:  # a shape the compiler rejects (registers, shared memory)
            print(f"  rows {rows} {name} {label}: {type(error_).__name__}", flush=True)
            continue
        error = ((got - expected).norm() / expected.norm()).item()
        results[label] = {"us": us, "gb_s": weight_bytes / us / 1e3, "relative_error_vs_spec": error,
                          "launch": {**launch.__dict__, "config": launch.config.__dict__ if launch.config else None}}
    print(f"rows {rows:2d} {name:8s} N={N:6d} K={K:5d} {weight_bytes / 1e6:6.1f} MB | " + " | ".join(
        f"{label} {r['us']:.2f} us {100 * r['gb_s'] * 1e9 / bandwidth:.0f}% (err {r['relative_error_vs_spec']:.0e})"
        for label, r in results.items()), flush=True)
    if results:
        best = min(results, key=lambda label: results[label]["us"])
        print(f"  fastest: {best} {results[best]['us']:.2f} us ({N}, {K}, {gated}, {rows}): "
              f"{variants[best]}", flush=True)
    del weights
    torch.cuda.empty_cache()
    return {"name": name, "N": N, "K": K, "kind": kind, "rows": rows, "weight_bytes": weight_bytes, "pdl": pdl,
            "results": results}


def probe_attention(device, position: int, max_seq: int, pdl: bool) -> list[dict]:
    heads, kv_heads, hd, layers = 32, 4, 64, 22
    qkv = torch.randn(1, (heads + 2 * kv_heads) * hd, device=device, dtype=torch.bfloat16)
    angles = torch.randn(max_seq, hd // 2, device=device)
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    caches = [(torch.randn(1, kv_heads, max_seq, hd, device=device, dtype=torch.bfloat16),
               torch.randn(1, kv_heads, max_seq, hd, device=device, dtype=torch.bfloat16)) for _ in range(layers)]
    at = torch.tensor([position], device=device)
    k_ref, v_ref = caches[0][0].clone(), caches[0][1].clone()
    expected = decode_ops.attention_decode(qkv, cos, sin, at, k_ref, v_ref, heads, kv_heads)
    got = ops.attention_decode(qkv, cos, sin, at, caches[0][0], caches[0][1], heads, kv_heads)
    error = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
    rows = []
    for block_t in (16, 32, 64, 128):
        us = time_per_launch_us([lambda k=k, v=v: ops.attention_decode(qkv, cos, sin, at, k, v, heads, kv_heads, block_t=block_t,
                                                                                    pdl=pdl)
                                 for k, v in caches])
        rows.append({"block_t": block_t, "us": us, "position": position})
        print(f"attention position {position} block_t {block_t:3d}: {us:.2f} us (rel err {error:.1e})", flush=True)
    return rows


def step_tpot(loaded, measured, options: FastOptions, label: str, batch_size: int = 1, prompt_length: int = 128,
              output_length: int = 128) -> dict:
    bench = BenchConfig(engine="fast", prompt_length=prompt_length, output_length=output_length, batch_size=batch_size,
                        warmup_runs=3, runs=10)
    result = run_benchmark(loaded, bench, measured, engine=FastEngine(loaded.model, options))
    s = result.summary
    line = result.roofline_summary()
    print(f"step {label}: TTFT p50 {s['ttft_ms']['p50']:.3f} ms | TPOT p50 {s['tpot_ms']['p50']:.4f} p99 "
          f"{s['tpot_ms']['p99']:.4f} ms | {100 * line['fraction_of_peak']:.1f}% of copy bandwidth | prepare "
          f"{result.prepare_ms / 1e3:.1f} s", flush=True)
    return {"label": label, "batch_size": batch_size, "prompt_length": prompt_length, "output_length": output_length,
            "summary": s, "roofline": line, "prepare_ms": result.prepare_ms}


# The attention kernels compared: one program per query head, and the split kernel with a few
# tile sizes (positions per tile) and range lengths (cache positions per range of the context);
# the per-head variants as named at every cache length (`head_whole_cache=0`: no cache in one tile).
SPLIT_POLICIES = {"head": ops.LaunchPolicy(head_whole_cache=0, head_range=0), "head t64": ops.LaunchPolicy(head_whole_cache=0, head_block_t=64, head_range=0),
                  "head t32": ops.LaunchPolicy(head_whole_cache=0, head_block_t=32, head_range=0),
                  "head r256": ops.LaunchPolicy(head_whole_cache=0, head_range=256),
                  "head t64 r128": ops.LaunchPolicy(head_whole_cache=0, head_block_t=64, head_range=128),
                  "head r512": ops.LaunchPolicy(head_whole_cache=0, head_range=512), "head r128": ops.LaunchPolicy(head_whole_cache=0, head_range=128),
                  "head t64 r256": ops.LaunchPolicy(head_whole_cache=0, head_block_t=64, head_range=256)} | {
    f"split t{block_t} r{positions}{combine}": ops.LaunchPolicy(
        attention="split", split_block_t=block_t, split_positions=positions,
        split_combine="kernel" if combine else "last")
    for block_t, positions, combine in ((16, 16, ""), (16, 32, ""), (16, 64, ""), (32, 32, ""), (32, 64, ""),
                                        (32, 128, ""), (16, 16, " c"), (16, 32, " c"), (32, 64, " c"))
}  # " c": the ranges combined by the second kernel (`split_combine="kernel"`), not in the kernel
# (batch, position, cache): short and long contexts, and a prompt of 128 in the 1024-position cache
# that 500 new tokens need (the default sweep's longest case), early and late in its decode
ATTENTION_CASES = [(1, 128, 256), (1, 128, 1024), (1, 600, 1024), (1, 1024, 2048), (1, 1920, 2048), (8, 128, 256),
                   (8, 1920, 2048)]


def attention_variants(loaded, measured, pdl: bool, variants=None, shapes=None, kernel_table: bool = True) -> dict:
    """The attention kernels side by side: each alone (22 layers' caches, replayed in a graph)
    at short and long contexts (unless not `kernel_table`), then the whole decode step at each
    (prompt, new tokens) of `shapes` (default `STEP_SHAPES`)."""
    heads, kv_heads, hd, layers = 32, 4, 64, 22
    device = loaded.device
    kernels = []
    for batch, position, max_seq in ATTENTION_CASES if kernel_table else ():
        qkv = torch.randn(batch, (heads + 2 * kv_heads) * hd, device=device, dtype=torch.bfloat16)
        angles = torch.randn(max_seq, hd // 2, device=device)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
        caches = [(torch.randn(batch, kv_heads, max_seq, hd, device=device, dtype=torch.bfloat16),
                   torch.randn(batch, kv_heads, max_seq, hd, device=device, dtype=torch.bfloat16)) for _ in range(layers)]
        at = torch.tensor([position], device=device)
        k_ref, v_ref = caches[0][0].clone(), caches[0][1].clone()
        expected = decode_ops.attention_decode(qkv, cos, sin, at, k_ref, v_ref, heads, kv_heads)
        row = {"batch": batch, "position": position, "cache": max_seq, "kv_bytes": 2 * batch * kv_heads * position * hd * 2}
        for name, policy in SPLIT_POLICIES.items():
            attend = ops.Kernels(pdl=pdl, policy=policy).attention_decode
            k0, v0 = caches[0][0].clone(), caches[0][1].clone()
            got = attend(qkv, cos, sin, at, k0, v0, heads, kv_heads)
            error = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
            us = time_per_launch_us([lambda k=k, v=v: attend(qkv, cos, sin, at, k, v, heads, kv_heads) for k, v in caches])
            row[name] = {"us": us, "relative_error_vs_spec": error}
            print(f"attention b{batch} position {position} cache {max_seq} {name}: {us:.2f} us (rel err {error:.1e})",
                  flush=True)
        kernels.append(row)
        del caches
    steps = []
    for prompt_length, output_length in shapes or STEP_SHAPES:
        for name, prefill, compiled in variants or STEP_VARIANTS:
            scope, static = compile_scope(compiled)
            options = FastOptions(compile=True, graphs=True, triton=True, launch=STEP_ATTENTION[name],
                                  prefill_attention=prefill, prefill_compile=scope, dynamic_prefill=not static)
            label = (f"decode attention {name}, prefill attention {prefill}, prefill compiled per {scope}"
                     f"{', per shape (static)' if static else ''}, prompt {prompt_length}, {output_length} new")
            steps.append({**step_tpot(loaded, measured, options, label, prompt_length=prompt_length,
                                      output_length=output_length),
                          "attention": name, "prefill_attention": prefill, "prefill_compile": compiled})
    return {"kernels": kernels, "steps": steps}


def compile_scope(compiled: str) -> tuple[str, bool]:
    """"model" -> ("model", False); "model-static" -> ("model", True): the prefill compiled for
    each shape (`FastOptions(dynamic_prefill=False)`), as the engine compiled it before it
    prepared once per model."""
    scope, _, static = compiled.partition("-")
    return scope, static == "static"


# (decode attention, prefill attention, prefill compiled per): the engine as it was (the whole
# prefill compiled, matmul attention; "-static": compiled per shape, as before the engine prepared
# once per model), each change alone, the split attention, and the choice by
# cache length ("auto": split for caches of 2048 positions, `LaunchPolicy.split_min_cache`); "split2" and "auto2" the same with the
# ranges combined by a second kernel; "ranges", "ranges128": the per-head kernel over ranges of 256
# or 128 positions (where the cache holds more than one); "t64": its loop 64 positions at a time.
STEP_ATTENTION = {"head": ops.LaunchPolicy(head_whole_cache=0, head_range=0), "split": ops.LaunchPolicy(attention="split"),
                  "auto": ops.LaunchPolicy(attention="auto"),
                  "split2": ops.LaunchPolicy(attention="split", split_combine="kernel"),
                  "auto2": ops.LaunchPolicy(attention="auto", split_combine="kernel"),
                  "ranges": ops.LaunchPolicy(head_whole_cache=0, head_range=256), "ranges128": ops.LaunchPolicy(head_whole_cache=0, head_range=128),
                  "t64": ops.LaunchPolicy(head_whole_cache=0, head_block_t=64, head_range=0),
                  "t64ranges128": ops.LaunchPolicy(head_whole_cache=0, head_block_t=64, head_range=128)}
STEP_VARIANTS = [("head", "matmul", "model"), ("head", "flash", "model"), ("head", "flash", "layer"),
                 ("split", "flash", "layer"), ("auto", "flash", "layer"), ("split2", "flash", "layer"),
                 ("auto2", "flash", "layer"), ("ranges", "flash", "layer"), ("ranges128", "flash", "layer"),
                 ("t64", "flash", "layer"), ("t64ranges128", "flash", "layer"),
                 ("head", "matmul", "model-static"), ("ranges128", "flash", "layer-static")]
# (prompt, new tokens): caches of 256, 1024 (the default sweep's N = 500) and 2048 positions
STEP_SHAPES = [(128, 128), (128, 500), (1920, 128)]


def step_shapes(text: str) -> list[tuple[int, int]]:
    """--step-shapes 128x128,1920x128 -> [(128, 128), (1920, 128)]: (prompt, new tokens)."""
    try:
        shapes = [tuple(int(n) for n in part.split("x")) for part in text.split(",") if part.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(shape) != 2 or min(shape) < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"--step-shapes: {text!r} is not PROMPTxNEW[,PROMPTxNEW...], e.g. 128x128,1920x128")
    return shapes


def row_counts(text: str) -> list[int]:
    """--probe-rows 4,16 -> [4, 16]: batch sizes of 2 rows or more."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 2:
        raise argparse.ArgumentTypeError(f"--probe-rows: {text!r} is not ROWS[,ROWS...] of 2 rows or more, e.g. 4,16")
    return counts


def step_variants(text: str) -> list[tuple[str, str, str]]:
    """--step-variants head/matmul/model,split/flash/layer -> the STEP_VARIANTS named."""
    known = {"/".join(v): v for v in STEP_VARIANTS}
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"--step-variants: unknown {unknown or text!r}; choose from {', '.join(known)}")
    return [known[c] for c in chosen]


NO_TABLE = MappingProxyType({})  # a policy's `rows`: every matrix in the policy-wide kernel and launch
ROWS_CANDIDATES = [ops.LaunchConfig(bn, bk, 4, stages) for bn in (16, 32) for bk in (128, 256, 512) for stages in (3, 4)]


def batched_steps(loaded, measured, batch_sizes: list[int], budget_s: float, candidates, targets=(0,)) -> list[dict]:
    """The decode step at each batch size: one program per row (per-row), the TMA kernel (the
    default from 4 rows, here from 2), one program per weight block for all rows on the CUDA
    cores (up to 8 rows), and the tensor-core kernel with each
    candidate launch shape and split-K target (programs per matrix; 0: no split), until the
    budget runs out."""
    deadline = time.perf_counter() + budget_s
    steps = []
    options = FastOptions(compile=False, graphs=True, triton=True)
    for batch_size in batch_sizes:
        if batch_size == 1:
            steps.append(step_tpot(loaded, measured, options, "triton, batch 1", 1))
            continue
        per_row = replace(options, launch=ops.LaunchPolicy(rows_min_batch=batch_size + 1, rows=NO_TABLE))
        steps.append({**step_tpot(loaded, measured, per_row, f"triton, batch {batch_size}, per-row", batch_size),
                      "batched_gemv": "per-row"})
        tma = replace(options, launch=ops.LaunchPolicy(rows_min_batch=2))
        steps.append({**step_tpot(loaded, measured, tma, f"triton, batch {batch_size}, TMA kernel (the default)",
                                  batch_size), "batched_gemv": "tma"})
        if batch_size <= ops.DEFAULT_POLICY.cuda_max_rows:
            cuda = replace(options, launch=ops.LaunchPolicy(batched="cuda", rows=NO_TABLE))
            steps.append({**step_tpot(loaded, measured, cuda, f"triton, batch {batch_size}, CUDA-core batch kernel",
                                      batch_size), "batched_gemv": "cuda"})
        for config, target, prefetch in itertools.product(candidates, targets, (False, True)):
            if time.perf_counter() > deadline:
                break
            rows = replace(options, launch=ops.LaunchPolicy(batched="tensor", rows_min_batch=2, rows_gemv=config,
                                                            rows_target_programs=target, rows_prefetch=prefetch,
                                                            rows=NO_TABLE))
            label = (f"triton, batch {batch_size}, rows {config.__dict__}, split-K target {target}"
                     f"{', first tile before the wait' if prefetch else ''}")
            try:
                step = step_tpot(loaded, measured, rows, label, batch_size)
            except Exception as error:  # a shape the compiler rejects (shared memory, registers)
                print(f"step {label}: {type(error).__name__}: {str(error).splitlines()[0][:120]}", flush=True)
                continue
            steps.append({**step, "batched_gemv": "rows", "config": config.__dict__, "split_k_target": target,
                          "rows_prefetch": prefetch})
    return steps


@torch.inference_mode()
def step_breakdown(loaded, position: int) -> dict:
    """Where a decode step's time goes: its parts captured and replayed on their own."""
    from inferlab.fast.engine import FastLlama, pick
    from inferlab.decode.sampling import SamplingConfig

    device = loaded.device
    net = FastLlama(loaded.model)
    cache = net.new_cache(1, 4096)
    hidden = net.embed[7:8].clone()
    at = torch.tensor([position], device=device)
    rows = {}
    for pdl in (False, True):
        kernels = ops.Kernels(pdl=pdl)
        rows[f"model (layers + lm head), PDL {'on' if pdl else 'off'}"] = graph_us(lambda: net.decode_hidden(hidden, at, cache, kernels))
    logits = net.decode_hidden(hidden, at, cache, ops.Kernels())
    tokens = torch.zeros(1, 1, dtype=torch.long, device=device)
    out = torch.zeros(1, 4096, dtype=torch.long, device=device)
    moving = torch.tensor([0], device=device)  # advances each replay: out has room for every replay

    def torch_bookkeeping():
        nxt = pick(logits, SamplingConfig(), None)
        tokens.copy_(nxt[:, None])
        out.index_copy_(1, moving + 1, nxt[:, None])
        hidden.copy_(F.embedding(nxt, net.embed))
        moving.add_(1)

    rows["greedy step kernel (argmax, embedding, bookkeeping)"] = graph_us(
        lambda: ops.greedy_step(logits, net.embed, hidden, tokens, out, moving, 0), replays=100)
    moving.zero_()
    rows["the same in torch ops"] = graph_us(torch_bookkeeping, replays=100)
    for label, us in rows.items():
        print(f"breakdown at position {position}: {label}: {us:.1f} us", flush=True)
    return {"position": position, "us": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="tinyllama-1.1b-random",
                        help="the model whose matrices are probed and whose step is timed (default tinyllama-1.1b-random; "
                             "smollm2-135m: its launch shapes, keyed by (N, K, gated) beside TinyLlama's)")
    parser.add_argument("--probe-budget-s", type=float, default=240, help="stop trying launch shapes after this long")
    parser.add_argument("--skip-step", action="store_true")
    parser.add_argument("--narrow", action="store_true", help="only the neighbourhood of the H200's best tiles")
    parser.add_argument("--no-pdl", action="store_true", help="probe the kernels launched one after another")
    parser.add_argument("--no-gemv-probe", action="store_true", help="skip probing the projections' launch shapes")
    parser.add_argument("--early-loads", action="store_true",
                        help="probe the one-row kernel with LaunchPolicy(early_loads=True), and time the step with it")
    parser.add_argument("--batch-sizes", default=None,
                        help="only the decode step at these batch sizes (e.g. 1,2,4,8): per-row programs against the "
                             "tensor-core kernel's launch shapes, within --probe-budget-s")
    parser.add_argument("--probe-rows", type=row_counts, default=None,
                        help="only each projection at these batch sizes (e.g. 4,16), alone, with every batched kernel: "
                             "per-row programs, the CUDA-core kernel, the tensor-core kernel (as it runs, prefetching, "
                             "split over K)")
    parser.add_argument("--rows-variants", default=None, metavar="REGEX",
                        help="with --probe-rows: only the batched kernels whose label matches (e.g. '^(tensor|stream)')")
    parser.add_argument("--rows-candidates", choices=("all", "in-use"), default="all",
                        help="the tensor-core kernel's launch shapes to try: all candidates, or the default policy's only")
    parser.add_argument("--rows-targets", default="0",
                        help="split-K targets for the tensor-core kernel (programs per matrix, 0: no split), e.g. 0,132,264")
    parser.add_argument("--attention-variants", action="store_true",
                        help="only the attention kernels (one program per head, split over the context) side by side, "
                             "alone and in the decode step at prompts 128 and 1920")
    parser.add_argument("--step-variants", type=step_variants, default=None,
                        help="with --attention-variants: the decode steps to run, as attention/prefill/compiled, e.g. "
                             "head/matmul/model,split/flash/layer (default: all of them)")
    parser.add_argument("--step-shapes", type=step_shapes, default=None,
                        help="with --attention-variants: the decode steps' (prompt, new tokens), e.g. 128x128,1920x128 "
                             "(default: 128x128,128x500,1920x128)")
    parser.add_argument("--no-kernel-table", action="store_true",
                        help="with --attention-variants: only the decode steps, not each kernel alone")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernel_configs: needs a CUDA device", file=sys.stderr)
        return 2
    out = new_run_folder(args.out, "kernels")  # a new folder each run: nothing earlier is overwritten
    print(f"writing to {out}", flush=True)
    device = torch.device("cuda")
    env = fingerprint.environment(device)
    measured = roofline.device_bandwidth(device, env["device_name"], probe=True)
    bandwidth = measured[0]
    import triton

    print(f"{env['device_name']} | torch {env['torch']} | triton {triton.__version__} | CUDA {env['cuda']} | "
          f"driver {env['driver']} | copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    if args.attention_variants:
        loaded = load_model(args.model, device, torch.bfloat16)
        report = attention_variants(loaded, measured, ops.pdl_supported(device) and not args.no_pdl, args.step_variants,
                                    args.step_shapes, kernel_table=not args.no_kernel_table)
        write_json_atomic(out / "attention.json", {"environment": env, "triton": triton.__version__,
                                                   "bandwidth": bandwidth, **report})
        return 0
    if args.probe_rows:
        loaded = load_model(args.model, device, torch.bfloat16)
        pdl = ops.pdl_supported(device) and not args.no_pdl
        probes = [probe_rows(*shape, rows, device, bandwidth, pdl, args.rows_variants) for rows in args.probe_rows
                  for shape in decode_matrices(loaded.model.config)]
        write_json_atomic(out / "rows.json", {"environment": env, "triton": triton.__version__,
                                              "bandwidth": bandwidth, "probes": probes})
        return 0
    if args.batch_sizes:
        loaded = load_model(args.model, device, torch.bfloat16)
        candidates = ROWS_CANDIDATES if args.rows_candidates == "all" else [ops.DEFAULT_POLICY.rows_gemv]
        steps = batched_steps(loaded, measured, [int(b) for b in args.batch_sizes.split(",")], args.probe_budget_s,
                              candidates, [int(t) for t in args.rows_targets.split(",")])
        write_json_atomic(out / "kernels.json", {"environment": env, "triton": triton.__version__,
                                                 "bandwidth": bandwidth, "steps": steps})
        return 0
    deadline = time.perf_counter() + args.probe_budget_s
    pdl = ops.pdl_supported(device) and not args.no_pdl
    print(f"programmatic dependent launch: {'on' if pdl else 'off'}", flush=True)
    tiles = NARROW_TILES if args.narrow else TILES
    loaded = load_model(args.model, device, torch.bfloat16)
    matrices = decode_matrices(loaded.model.config)
    layers = int(loaded.model.config.num_hidden_layers)
    policy = ops.LaunchPolicy(early_loads=args.early_loads)
    shapes = [] if args.no_gemv_probe else [probe_shape(*shape, device, bandwidth, deadline, tiles, pdl, policy)
                                            for shape in matrices]
    attention = [row for position in (128, 255) for row in probe_attention(device, position, 256, pdl)]
    report = {"environment": env, "triton": triton.__version__, "bandwidth": bandwidth, "pdl": pdl,
              "early_loads": args.early_loads, "shapes": shapes, "attention": attention}
    write_json_atomic(out / "probes.json", report)  # kept if the step measurements below fail

    best = {(s["N"], s["K"], s["kind"] == "gated"): ops.LaunchConfig(**s["results"][0]["config"]) for s in shapes if s["results"]}
    if len(best) == len(matrices):
        per_layer_us = sum(s["results"][0]["us"] for s in shapes if s["name"] != "lm_head")
        attention_us = min(r["us"] for r in attention if r["position"] == 128)
        lm_us = next(s["results"][0]["us"] for s in shapes if s["name"] == "lm_head")
        print(f"sum of best kernel times: {layers} x ({per_layer_us:.2f} + attention {attention_us:.2f}) + lm_head "
              f"{lm_us:.2f} = {(layers * (per_layer_us + attention_us) + lm_us) / 1e3:.4f} ms (attention at TinyLlama's heads)",
              flush=True)
        print("MEASURED_GEMV = {" + ", ".join(f"{k}: LaunchConfig({c.block_n}, {c.block_k}, {c.num_warps}, {c.num_stages})"
                                              for k, c in best.items()) + "}", flush=True)
    if args.skip_step:
        return 0
    report["breakdown"] = [step_breakdown(loaded, position) for position in (128, 192, 255)]
    in_use = ops.DEFAULT_POLICY.gemv
    steps = []
    for pdl_on in (False, True):
        options = FastOptions(compile=False, graphs=True, triton=True, pdl=pdl_on)
        steps.append(step_tpot(loaded, measured, options, f"triton, shapes in use, PDL {'on' if pdl_on else 'off'}"))
    early = " early loads," if args.early_loads else ""
    if args.early_loads:
        options = FastOptions(compile=False, graphs=True, triton=True, pdl=pdl, launch=policy)
        steps.append(step_tpot(loaded, measured, options, f"triton, shapes in use,{early} PDL {'on' if pdl else 'off'}"))
    if any(in_use.get(key) != config for key, config in best.items()):
        probed = replace(policy, gemv=MappingProxyType({**in_use, **best}))
        options = FastOptions(compile=False, graphs=True, triton=True, pdl=pdl, launch=probed)
        steps.append(step_tpot(loaded, measured, options,
                               f"triton, best shapes of this probe,{early} PDL {'on' if pdl else 'off'}"))
    report["steps"] = steps
    write_json_atomic(out / "kernels.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
