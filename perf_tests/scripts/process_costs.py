"""Where one GPU perf-suite process spends its time before it measures: imports, CUDA, the model, engine prepare.

    PYTHONPATH=. python perf_tests/scripts/process_costs.py [--engines fast,fast,fast-split]

Each engine named is prepared in turn for prompt 128, 32 new tokens, batch 1 (the repeated name
shows a second prepare in the same process). Prepare includes compiling (cached by inductor
across processes) and capturing the CUDA graphs.
"""

import argparse
import sys
import time

START = time.perf_counter()

import torch  # noqa: E402

from inferlab.decode.engines import make_engine  # noqa: E402
from inferlab.measure.bench import BenchConfig, prepare_case  # noqa: E402
from inferlab.model.registry import load_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="fast,fast,fast-split")
    parser.add_argument("--model", default="tinyllama-1.1b-random")
    args = parser.parse_args()
    print(f"imports {time.perf_counter() - START:.1f} s", flush=True)
    if not torch.cuda.is_available():
        print("process_costs: needs a CUDA device", file=sys.stderr)
        return 2
    began = time.perf_counter()
    torch.ones(1, device="cuda")
    print(f"cuda init {time.perf_counter() - began:.1f} s", flush=True)
    began = time.perf_counter()
    loaded = load_model(args.model, torch.device("cuda"), torch.bfloat16)
    print(f"load {args.model} {time.perf_counter() - began:.1f} s", flush=True)
    for name in args.engines.split(","):
        began = time.perf_counter()
        config = BenchConfig(engine=name, prompt_length=128, output_length=32, batch_size=1, warmup_runs=2, runs=5)
        prepare_case(loaded, config, engine=make_engine(name, loaded.model))
        print(f"prepare {name} p128 n32: {time.perf_counter() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
