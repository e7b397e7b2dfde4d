"""A profiled decode step, kernel launch by kernel launch: the trace `inferlab bench --profile` writes.

    PYTHONPATH=. python3 -m inferlab bench tinyllama-1.1b-random --engine fast --batch-size 4 --profile --out results/p4
    PYTHONPATH=. python3 perf_tests/scripts/step_kernels.py results/p4/<run>-bench/bench.trace.json

The bench's own table ranks kernels by name, so one projection kernel launched for [q; k; v], o,
[gate; up] and down is one row. Here each kernel at each grid is a row of its own (the grid tells
the matrices apart), in the order of its first launch in the recorded steps, with its device
time and launches per step and its share of the step's kernel time. `--steps` is the number of
steps the bench recorded (it prints it: "decode steps 3-5 (3 steps)"; default 3). Under
programmatic dependent launch, kernels overlap: the shares are of summed kernel time, not of the
step's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferlab.measure.profiling import STEPS, LaunchTime, kernel_launches


def table(rows: tuple[LaunchTime, ...], steps: int) -> str:
    total = sum(r.us_per_step for r in rows)
    lines = [f"kernel launches per step, over {steps} recorded steps, in launch order",
             f"{'#':>3}  {'us/step':>9}  {'share':>6}  {'calls/step':>10}  {'grid':<16} kernel"]
    for index, r in enumerate(rows, 1):
        grid = "x".join(str(g) for g in r.grid) or "-"
        lines.append(f"{index:>3}  {r.us_per_step:9.2f}  {100 * r.us_per_step / total:5.1f}%  {r.calls_per_step:10.1f}  "
                     f"{grid:<16} {r.name}")
    launches = sum(r.calls_per_step for r in rows)
    lines.append(f"total: {total:.1f} us of kernel time and {launches:.0f} launches per step")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="a Chrome trace from inferlab bench --profile (bench.trace.json)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"steps the trace recorded (default {STEPS})")
    args = parser.parse_args()
    if args.steps < 1:
        print(f"step_kernels: --steps {args.steps} must be at least 1 (the steps the bench recorded, e.g. 3)",
              file=sys.stderr)
        return 2
    try:
        events = json.loads(args.trace.read_text())["traceEvents"]
    except OSError as error:
        print(f"step_kernels: cannot read {args.trace} ({error.strerror}); give the bench.trace.json that "
              "inferlab bench --profile wrote", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError):
        print(f"step_kernels: {args.trace} is not a Chrome trace with traceEvents; give the bench.trace.json that "
              "inferlab bench --profile wrote", file=sys.stderr)
        return 2
    rows = kernel_launches(events, args.steps) if isinstance(events, list) else ()
    if not rows:
        print(f"step_kernels: {args.trace} holds no GPU kernel events (a CPU profile ranks operators: see the "
              "bench's own table); profile on a GPU", file=sys.stderr)
        return 2
    print(table(rows, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
