"""What one kernel boundary costs on this GPU, and the floor it puts under a decode step.

    PYTHONPATH=. python3 perf_tests/scripts/launch_floor.py --out results/floor

A decode step of the fast engine is a chain of kernels, each waiting on the one before (five a
layer, six where the attention runs over ranges, then the LM head and the step kernel). Where
the weights are few (SmolLM2-135M: 270 MB, 0.09 ms at 3 TB/s) the step is bound by that chain,
not by bytes. This script measures the chain alone: a CUDA graph of `--links` launches of a
kernel that does nothing but wait on the one before it and pass a value on, replayed between
CUDA events (time per launch = replay time / launches), with and without programmatic dependent
launch, at grids of 1 to 4 programs per SM:

- "empty": the wait, one load of what the previous kernel wrote, one store;
- "reduce": the wait, then what a projection kernel does after it: a vector of 2,048 values
  written by the previous kernel loaded from L2, summed across the program (a reduction through
  shared memory), one value stored.

- "grid barrier": the same "reduce" work as phases of one persistent kernel with one or two
  programs per SM, separated by the grid barrier of `LaunchPolicy(persistent=True)` instead of
  kernel boundaries (time per phase = kernel time / phases).

Then, for each `--model`, the floor of its greedy decode step at batch 1 over a cache of 256
positions (prompt 128 + 128 new tokens): kernels per step (`LaunchPolicy.decode_kernels`, for
the default policy, which reads such a cache in one tile, and with `head_whole_cache=0`, over two
ranges merged by a second kernel) x the boundary ("reduce", PDL on where
supported, one program per SM) + the weight bytes / the probed copy bandwidth. A step cannot
run faster than that without fewer kernels. Results in <out>/<time>-floor/floor.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from inferlab.fast import kernels as ops
from inferlab.fast.kernels import persistent
from inferlab.measure import fingerprint, roofline
from inferlab.measure.graph_timing import time_per_launch_us
from inferlab.model.registry import load_model
from inferlab.storage import new_run_folder, write_json_atomic

REDUCE_BLOCK = 2048
CACHE_LENGTH = 256  # prompt 128 + 128 new tokens: by default the attention reads it in one tile
POLICIES = {"default": ops.DEFAULT_POLICY, "head_whole_cache=0": ops.LaunchPolicy(head_whole_cache=0)}


@triton.jit
def _link_kernel(src_ptr, dst_ptr, BLOCK: tl.constexpr, REDUCE: tl.constexpr, PDL: tl.constexpr):
    """One link of a chain: wait on the previous kernel, read what it wrote, write for the next.
    REDUCE: read BLOCK values and sum them across the program; else read one value."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    pid = tl.program_id(0)
    if REDUCE:
        total = tl.sum(tl.load(src_ptr + tl.arange(0, BLOCK)), axis=0)
    else:
        total = tl.load(src_ptr)
    tl.store(dst_ptr + pid % BLOCK, total + 1.0)


@triton.jit
def _barrier_chain_kernel(a_ptr, b_ptr, bar_ptr, err_ptr, phases, BLOCK: tl.constexpr, NPROG: tl.constexpr,
                          SYNC: tl.constexpr, SPIN: tl.constexpr):
    """`phases` links of the "reduce" kind inside one persistent kernel: each phase waits at the
    grid barrier of `inferlab.fast.kernels.persistent` (where a kernel boundary would be), reads
    the BLOCK values the last phase wrote, sums them and writes for the next. The last program
    to arrive resets the count, as `_decode_layers_kernel` does."""
    pid = tl.program_id(0)
    phase = 0
    while phase < phases:  # a while loop: a `range` over an argument breaks the interpreter
        src, dst = a_ptr, b_ptr
        if phase % 2 == 1:
            src, dst = b_ptr, a_ptr
        if SYNC:
            persistent._grid_wait(bar_ptr, err_ptr, phase * NPROG, SPIN)
        total = tl.sum(tl.load(src + tl.arange(0, BLOCK), cache_modifier=".cg"), axis=0)
        tl.store(dst + pid % BLOCK, total + 1.0)
        if SYNC:
            if phase + 1 < phases:
                persistent._grid_arrive(bar_ptr)
        phase += 1
    if SYNC:
        tl.debug_barrier()
        if tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") == phases * NPROG - 1:
            tl.atomic_xchg(bar_ptr, 0)


def barrier_chain(buffers: tuple[torch.Tensor, torch.Tensor], phases: int, programs: int, sync: bool = True) -> None:
    """One launch of `phases` barrier-separated links (`_barrier_chain_kernel`); without `sync`
    (the interpreter, which runs programs one after another), one launch a phase."""
    a, b = buffers
    bar, err = persistent._barrier(a.device)
    if sync:
        _barrier_chain_kernel[(programs,)](a, b, bar, err, phases, BLOCK=REDUCE_BLOCK, NPROG=programs, SYNC=True,
                                           SPIN=persistent.SPIN_LIMIT, num_warps=4)
        return
    for phase in range(phases):
        src, dst = (a, b) if phase % 2 == 0 else (b, a)
        _barrier_chain_kernel[(programs,)](src, dst, bar, err, 1, BLOCK=REDUCE_BLOCK, NPROG=programs, SYNC=False,
                                           SPIN=persistent.SPIN_LIMIT, num_warps=4)


def link(src: torch.Tensor, dst: torch.Tensor, programs: int, reduce: bool, pdl: bool) -> None:
    """Launch one link: `programs` programs read `src` and write `dst` (both REDUCE_BLOCK floats)."""
    _link_kernel[(programs,)](src, dst, BLOCK=REDUCE_BLOCK, REDUCE=reduce, PDL=pdl, num_warps=4,
                              **({"launch_pdl": True} if pdl else {}))


def chain(buffers: tuple[torch.Tensor, torch.Tensor], links: int, programs: int, reduce: bool, pdl: bool) -> list:
    """`links` launches, alternating the two buffers, so each reads what the one before wrote."""
    a, b = buffers
    return [lambda i=i: link(a if i % 2 == 0 else b, b if i % 2 == 0 else a, programs, reduce, pdl) for i in range(links)]


def step_floor_ms(kernels: int, boundary_us: float, weight_bytes: int, bandwidth: float) -> float:
    """The floor of a step: its chain of kernel boundaries, plus its bytes at the copy bandwidth."""
    return kernels * boundary_us / 1e3 + weight_bytes / bandwidth * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--links", type=int, default=150, help="launches in the graph (default 150: a SmolLM2 step)")
    parser.add_argument("--model", action="append", default=None,
                        help="a model whose step floor to state (repeatable; default tinyllama-1.1b-random and "
                             "smollm2-135m, which needs its package)")
    args = parser.parse_args()
    if args.links < 2:
        print(f"launch_floor: --links must be at least 2, not {args.links}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("launch_floor: needs a CUDA device", file=sys.stderr)
        return 2
    out = new_run_folder(args.out, "floor")  # a new folder each run: nothing earlier is overwritten
    device = torch.device("cuda")
    env = fingerprint.environment(device)
    bandwidth = roofline.device_bandwidth(device, env["device_name"], probe=True)[0]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    pdl_modes = (False, True) if ops.pdl_supported(device) else (False,)
    print(f"{env['device_name']} | {sms} SMs | torch {env['torch']} | triton {triton.__version__} | "
          f"copy bandwidth {bandwidth / 1e9:.0f} GB/s | {args.links} links", flush=True)
    buffers = (torch.zeros(REDUCE_BLOCK, device=device), torch.zeros(REDUCE_BLOCK, device=device))
    rows = []
    for reduce in (False, True):
        for programs in (1, sms, 4 * sms):
            for pdl in pdl_modes:
                us = time_per_launch_us(chain(buffers, args.links, programs, reduce, pdl))
                rows.append({"link": "reduce" if reduce else "empty", "programs": programs, "pdl": pdl, "us": us})
                print(f"{rows[-1]['link']:6s} {programs:4d} programs, PDL {'on ' if pdl else 'off'}: "
                      f"{us:.2f} us a kernel", flush=True)
    for programs in (sms, 2 * sms):  # the persistent kernel's grid: one or two programs per SM
        us = time_per_launch_us([lambda p=programs: barrier_chain(buffers, args.links, p)]) / args.links
        rows.append({"link": "grid barrier", "programs": programs, "pdl": False, "us": us})
        print(f"grid barrier {programs:4d} programs: {us:.2f} us a phase (one kernel of {args.links} phases)", flush=True)
    if ops.barrier_errors(device):
        print("launch_floor: a grid barrier gave up waiting (its programs were not all resident): the barrier rows "
              "mean nothing", flush=True)
    boundary = next(r["us"] for r in rows if r["link"] == "reduce" and r["programs"] == sms and r["pdl"] == pdl_modes[-1])
    floors = []
    for name in args.model or ["tinyllama-1.1b-random", "smollm2-135m"]:
        try:
            model = load_model(name, device, torch.bfloat16).model
        except Exception as error:  # the embedded model needs its package; the others still count
            print(f"{name}: not loaded ({type(error).__name__}: {str(error).splitlines()[0][:100]})", flush=True)
            continue
        layers, weights = int(model.config.num_hidden_layers), roofline.weight_bytes_per_step(model, 1)
        for label, policy in POLICIES.items():
            kernels = policy.decode_kernels(layers, CACHE_LENGTH)
            floor = step_floor_ms(kernels, boundary, weights, bandwidth)
            floors.append({"model": name, "policy": label, "kernels": kernels, "weight_bytes": weights,
                           "boundary_us": boundary, "floor_ms": floor})
            print(f"{name}, {label}: {kernels} kernels x {boundary:.2f} us + {weights / 1e6:.0f} MB at "
                  f"{bandwidth / 1e9:.0f} GB/s = floor {floor:.3f} ms a step", flush=True)
        del model
        torch.cuda.empty_cache()
    write_json_atomic(out / "floor.json", {"environment": env, "triton": triton.__version__, "bandwidth": bandwidth,
                                           "sms": sms, "links": args.links, "chains": rows, "floors": floors})
    print(f"written: {out / 'floor.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
