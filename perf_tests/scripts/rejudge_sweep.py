"""The hypotheses of saved sweeps, judged again with the rules of this checkout.

    PYTHONPATH=. python perf_tests/scripts/rejudge_sweep.py SWEEP_FOLDER_OR_JSON [...]

Reads each sweep.json (every raw run is kept there), groups the results that ran by engine,
prompt length and batch size as the sweep does, and prints each hypothesis's verdict and line.
Nothing is written: a saved sweep keeps the verdicts it was made with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferlab.measure.metrics import RunTimes
from inferlab.suite import hypotheses


def groups(sweep: dict) -> dict[tuple[str, int, int], list[dict]]:
    """The results that ran, by (engine, prompt length, batch size)."""
    out: dict[tuple[str, int, int], list[dict]] = {}
    for result in sweep["results"]:
        if result.get("status") == "ok":
            config = result["config"]
            out.setdefault((config["engine"], result["prompt_length"], config["batch_size"]), []).append(result)
    return out


def judge(members: list[dict]) -> tuple[hypotheses.Verdict, ...]:
    lengths = [m["config"]["output_length"] for m in members]
    runs = [[RunTimes(tuple(run["token_ms"])) for run in m["runs"]] for m in members]
    rooflines = [m.get("roofline") for m in members]
    per_step = None if any(r is None for r in rooflines) else [r["bytes_per_step"] for r in rooflines]
    return hypotheses.check_all(lengths, runs, per_step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep folders or their sweep.json")
    args = parser.parse_args()
    for path in args.sweeps:
        file = path / "sweep.json" if path.is_dir() else path
        if not file.is_file():
            print(f"rejudge_sweep: no sweep.json at {path}: name a sweep's folder or its sweep.json", file=sys.stderr)
            return 2
        print(f"{file}:")
        for (engine, prompt, batch), members in groups(json.loads(file.read_text())).items():
            for verdict in judge(members):
                print(f"  {engine} p{prompt} b{batch}  {verdict.verdict.upper():15} {verdict.name}: {verdict.explanation}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
