"""(Run from the repository root with PYTHONPATH=.: python3 docs/perf/h100/targets-5/prefill_mm.py 128.)
The prefill's four products at 128 rows: cuBLAS (F.linear) against split-K by batched GEMM and
the Triton tensor-core rows kernel in several tiles. 22 copies of each weight (as in the
prefill's 22 layers: no weight stays in L2), each launch in a CUDA graph, us a launch."""
import sys

import torch
import torch.nn.functional as F
from inferlab.measure.graph_timing import time_per_launch_us
from inferlab.fast import kernels
from inferlab.fast.kernels import LaunchConfig, LaunchPolicy

torch.manual_seed(0)
dev = torch.device("cuda")
M = int(sys.argv[1]) if len(sys.argv) > 1 else 128
LAYERS = 22
SHAPES = {"qkv": (2560, 2048), "o": (2048, 2048), "gate/up": (11264, 2048), "down": (2048, 5632)}

def report(shape, variant, us, err, nbytes):
    gbs = nbytes / (us * 1e-6) / 1e9
    print(f"M {M:4d} | {shape:8s} | {variant:44s} | {us:8.2f} us | {gbs:7.0f} GB/s | max err {err:.4f}", flush=True)

for name, (N, K) in SHAPES.items():
    ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    ref = (x.float() @ ws[0].float().T)
    nbytes = N * K * 2
    def run(variant, fn):
        try:
            err = (fn(ws[0]).float() - ref).abs().max().item()
            us = time_per_launch_us([(lambda w=w: fn(w)) for w in ws], replays=10, repeats=5)
            report(name, variant, us, err, nbytes)
        except Exception as e:  # noqa
            print(f"M {M:4d} | {name:8s} | {variant:44s} | failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
    run("cuBLAS F.linear", lambda w: F.linear(x, w))
    for S in (2, 4, 8):
        def split(w, S=S):
            xs = x.view(M, S, K // S).permute(1, 0, 2)
            wt = w.view(N, S, K // S).permute(1, 2, 0)
            try:
                part = torch.bmm(xs, wt, out_dtype=torch.float32)
            except TypeError:
                part = torch.bmm(xs, wt).float()
            return part.sum(0).to(torch.bfloat16)
        run(f"bmm split-K {S} + sum (eager)", split)
    for bm, bn, bk, warps, stages, target in ((16, 32, 256, 4, 4, 0), (64, 64, 64, 4, 3, 0), (64, 64, 64, 4, 3, 264),
                                              (64, 32, 128, 4, 4, 264), (128, 64, 64, 8, 3, 0), (128, 64, 64, 8, 3, 264),
                                              (64, 128, 64, 8, 3, 264), (128, 32, 128, 8, 3, 264), (64, 64, 128, 4, 3, 528)):
        policy = LaunchPolicy(rows_block_m=bm, rows_gemv=LaunchConfig(bn, bk, warps, stages), rows_target_programs=target,
                              rows={})
        run(f"triton rows BM{bm} BN{bn} BK{bk} w{warps} s{stages} T{target}",
            lambda w, policy=policy: kernels.gemv(x, w, policy=policy, pdl=False))
    del ws
    torch.cuda.empty_cache()
