"""How often does `inferlab ab` FAIL unchanged code, and how often does it catch an injected slowdown?

    PYTHONPATH=. python perf_tests/scripts/ab_experiment.py --out results/ab-cpu --delay-ms 0.2 --trials 20
    PYTHONPATH=. python perf_tests/scripts/ab_experiment.py --out results/ab-h200 --trials 20 --delay-ms 0.036 \\
        --suite "python -m pytest perf_tests/test_decode_gpu.py -m gpu -p no:cacheprovider -q --inferlab-engines fast \\
                 --inferlab-output-lengths 128 --inferlab-prompt-lengths 128 --inferlab-rounds 20"

Each trial is one `inferlab ab` session (`run_ab` with the command runner) in its own folder
under OUT: an A/A trial runs the same suite command on both sides; an injected trial adds
``--inferlab-inject-delay-ms D`` to the head side (a fixed delay per decode step: choose D as the
slowdown you want, e.g. 10% of the TPOT a calibration run shows). A/A and injected trials
alternate. Reported per kind: FAIL / PASS / INCONCLUSIVE counts, median pairs and minutes per
decision, the median MDE and run noise; written to OUT/summary-<time>.json (never overwritten).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from inferlab.storage import new_run_folder, write_json_atomic
from inferlab.suite import ab
from inferlab.suite.gate.thresholds import parse_thresholds

CPU_SUITE = (f"{sys.executable} -m pytest perf_tests/test_decode_cpu.py -m 'perf and not slow' -p no:cacheprovider -q "
             "-k 'eager and tpot' --inferlab-device cpu")


def trial(kind: str, index: int, options: argparse.Namespace) -> dict:
    head = options.suite + (f" --inferlab-inject-delay-ms {options.delay_ms}" if kind == "injected" else "")
    folder = new_run_folder(options.out, f"{kind}-{index:02d}")
    runner = ab.command_runner({"base": options.suite, "head": head}, logs=folder)
    plan = ab.Plan(parse_thresholds(options.threshold), options.confidence, options.min_pairs, options.max_pairs,
                   options.max_minutes)
    outcome = ab.run_ab(runner, plan, folder)
    write_json_atomic(folder / "ab.json", ab.outcome_dict(outcome, plan, {"base": options.suite, "head": head}))
    last = outcome.last
    return {"kind": kind, "folder": str(folder), "verdict": last.verdict if last else "INCONCLUSIVE",
            "pairs": outcome.pairs, "minutes": outcome.seconds / 60, "stopped_by": outcome.stopped_by,
            "mde": max(r.mde for r in last.rows) if last else None,
            "run_noise": max(r.run_noise for r in last.rows) if last else None}


def summary(results: list[dict]) -> dict:
    out = {}
    for kind in ("aa", "injected"):
        rows = [r for r in results if r["kind"] == kind]
        if rows:
            out[kind] = {v: sum(r["verdict"] == v for r in rows) for v in ("FAIL", "PASS", "INCONCLUSIVE")}
            out[kind].update(trials=len(rows), median_pairs=float(np.median([r["pairs"] for r in rows])),
                             median_minutes=float(np.median([r["minutes"] for r in rows])),
                             median_mde=float(np.median([r["mde"] for r in rows if r["mde"] is not None] or [np.nan])),
                             median_run_noise=float(np.median([r["run_noise"] for r in rows if r["run_noise"] is not None] or [np.nan])))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--suite", default=CPU_SUITE, help="the perf-suite command both sides run")
    parser.add_argument("--delay-ms", type=float, required=True, help="per-step delay injected into the head side")
    parser.add_argument("--trials", type=int, default=20, help="trials per kind (A/A and injected)")
    parser.add_argument("--threshold", default="5%")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--min-pairs", type=int, default=3)
    parser.add_argument("--max-pairs", type=int, default=20)
    parser.add_argument("--max-minutes", type=float, default=15.0)
    options = parser.parse_args()
    results = []
    for index in range(options.trials):
        for kind in ("aa", "injected"):
            results.append(trial(kind, index, options))
            print(results[-1], flush=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    write_json_atomic(options.out / f"summary-{stamp}.json", {"settings": vars(options) | {"out": str(options.out)},
                                                              "trials": results, "summary": summary(results)})
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
