"""A profiled decode step, kernel launch by kernel launch: the trace `inferlab bench --profile` writes.

    PYTHONPATH=. python3 -m inferlab bench tinyllama-1.1b-random --engine fast --batch-size 4 --profile --out results/p4
    PYTHONPATH=. python3 perf_tests/scripts/step_kernels.py results/p4/<run>-bench/bench.json

The bench's own table ranks kernels by name, so one projection kernel launched for [q; k; v], o,
[gate; up] and down is one row. Here each kernel at each grid is a row of its own (the grid tells
the matrices apart), in the order of its first launch in the recorded steps, with its device
time, the time it adds to the step ("adds us": its end minus the later of its start and the
previous kernel's end) and its share of that, and launches per step. Under programmatic dependent
launch a kernel starts while the one before it still runs, so device times overlap and count the
waits twice; the added times do not, and sum to the device's busy time. The result JSON (a
bench's `bench.json`, or a sweep's `results/*.json`) names its trace. The table covers the whole
steps in it: from the first launch of the step's closing kernel (the last kernel recorded, the
greedy or sampling step) to its last (`whole_steps`); a trace where that count is not within
one of the steps the profile says it recorded (fewer than two such launches, or a closing
kernel launched many times a step, as in the eager engines) is taken whole, over those steps.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferlab.errors import UsageError
from inferlab.look.profile_diff import load_profile
from inferlab.measure.profiling import LaunchTime, kernel_launches, whole_steps


def table(rows: tuple[LaunchTime, ...], steps: int) -> str:
    total = sum(r.us_per_step for r in rows)
    chain = sum(r.chain_us_per_step for r in rows)
    lines = [f"kernel launches per step, over {steps} recorded steps, in launch order",
             f"{'#':>3}  {'us/step':>9}  {'adds us':>9}  {'share':>6}  {'calls/step':>10}  {'grid':<16} kernel"]
    for index, r in enumerate(rows, 1):
        grid = "x".join(str(g) for g in r.grid) or "-"
        share = 100 * r.chain_us_per_step / chain if chain else 0.0
        lines.append(f"{index:>3}  {r.us_per_step:9.2f}  {r.chain_us_per_step:9.2f}  {share:5.1f}%  "
                     f"{r.calls_per_step:10.1f}  {grid:<16} {r.name}")
    launches = sum(r.calls_per_step for r in rows)
    lines.append(f"total: {total:.1f} us of kernel time, {chain:.1f} us of busy device time and {launches:.0f} "
                 "launches per step")
    return "\n".join(lines)


def trace_of(result: Path, name: str) -> Path:
    """The trace a result JSON names: beside it (a bench), or in its run's `profiles/` (a sweep)."""
    beside = result.parent / name
    return beside if beside.exists() else result.parent.parent / "profiles" / name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path, help="a result JSON written by inferlab bench --profile (bench.json)")
    args = parser.parse_args()
    try:
        summary = load_profile(args.result)
    except UsageError as error:
        print(f"step_kernels: {error}", file=sys.stderr)
        return 2
    trace = trace_of(args.result, summary.trace)
    try:
        events = json.loads(trace.read_text())["traceEvents"]
    except OSError as error:
        print(f"step_kernels: cannot read the trace {trace} that {args.result} names ({error.strerror}); profile "
              "again with inferlab bench --profile", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError):
        print(f"step_kernels: {trace} is not a Chrome trace with traceEvents; profile again with inferlab bench "
              "--profile", file=sys.stderr)
        return 2
    kept, steps = whole_steps(events, summary.steps) if isinstance(events, list) else ([], 0)
    if not steps:  # no step boundary found: every kernel event, over the steps the profile says it recorded
        kept, steps = (events if isinstance(events, list) else []), summary.steps
    rows = kernel_launches(kept, steps)
    if not rows:
        print(f"step_kernels: {trace} holds no GPU kernel events (a CPU profile ranks operators: see the bench's "
              "own table); profile on a GPU", file=sys.stderr)
        return 2
    print(table(rows, steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
