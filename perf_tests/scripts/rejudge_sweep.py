"""The hypotheses of saved sweeps, judged again with the rules of this checkout.

    PYTHONPATH=. python perf_tests/scripts/rejudge_sweep.py SWEEP_FOLDER_OR_JSON [...]

Reads each sweep.json (every raw run is kept there), judges it with
`inferlab.suite.sweep.saved_group_verdicts` and prints each hypothesis's verdict and line.
Nothing is written: a saved sweep keeps the verdicts it was made with.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferlab.suite.sweep import saved_group_verdicts


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
        for group in saved_group_verdicts(json.loads(file.read_text())):
            for verdict in group.verdicts:
                print(f"  {group.engine} p{group.prompt_length} b{group.batch_size}  {verdict.verdict.upper():15} "
                      f"{verdict.name}: {verdict.explanation}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
