"""`inferlab history` on two synthetic histories of 30 saved runs whose changes are known.

    PYTHONPATH=. python3 perf_tests/scripts/history_experiment.py --out results/history

- step: flat, then one 3% step at run 16 (commit c015);
- slips: flat, then ten consecutive 0.5% slips from run 10 on (+5.1% in all), then flat.

Each run holds 20 rounds of one TPOT entry: the true median x a N(0, 0.3%) shift per run x N(0, 1%)
per round (`inferlab.suite.gate.simulate.synthetic_history`, seeded). The runs are written as
pytest-benchmark saves them, then the command a user types runs on each folder:
`inferlab history DIR --drift-budget 4% --out OUT`. Every pair of neighbouring runs also goes
through the two-run gate (5%), which passes each slip.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferlab.cli import main as inferlab
from inferlab.storage import new_run_folder, write_json_atomic
from inferlab.suite import gate
from inferlab.suite.gate.simulate import synthetic_history

HISTORIES = {
    "step": [1.0 if i < 15 else 1.03 for i in range(30)],
    "slips": [1.005 ** min(max(i - 9, 0), 10) for i in range(30)],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = new_run_folder(args.out, "history")
    summary = {}
    for name, levels in HISTORIES.items():
        folder = out / name / ".benchmarks" / "runner-1"
        folder.mkdir(parents=True)
        paths = []
        for i, run in enumerate(synthetic_history(levels, seed=args.seed)):
            path = folder / f"{i + 1:04d}_{run['commit_info']['id']}.json"
            write_json_atomic(path, run)
            paths.append(path)
        print(f"== {name}: inferlab history {folder} --drift-budget 4%", flush=True)
        code = inferlab(["history", str(folder), "--drift-budget", "4%", "--out", str(out / name / "report")])
        runs = [gate.load_run(p) for p in paths]
        pairs = [gate.compare([a], [b], thresholds={"default": 0.05}).verdict for a, b in zip(runs, runs[1:])]
        report = json.loads(next((out / name / "report").glob("*/history.json")).read_text())
        summary[name] = {"exit_code": code, "report": report, "two_run_gate_verdicts": pairs}
        print(f"exit code {code}; two-run gate over the 29 neighbouring pairs: "
              f"{ {v: pairs.count(v) for v in sorted(set(pairs))} }", flush=True)
    write_json_atomic(out / "summary.json", summary)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
