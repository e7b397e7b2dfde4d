"""The defaults as shipped, checked on one GPU: the design card's suite and the gate on it, the default sweep.

    PYTHONPATH=. python3 perf_tests/scripts/defaults_check.py --out /tmp/defaults --steps suite,suite,suite-inject,gate
    PYTHONPATH=. python3 perf_tests/scripts/defaults_check.py --out /tmp/defaults --steps sweep,sweep-inject,sweep

Steps, each one process typed as a user types it, at the repository root, timed:

- ``suite``: ``python -m pytest -m gpu --benchmark-autosave --benchmark-save-data`` (the design
  card's command: the GPU benchmarks alone), saved under OUT/benchmarks;
- ``suite-inject``: the same with ``--inferlab-inject-delay-ms D``, D = --inject-fraction (5%) of
  the slowest TPOT entry of the first suite run, so that every TPOT entry slows by at least that
  fraction (each entry's actual fraction is reported);
- ``gate``: ``python -m inferlab gate`` on the first two suite runs (A/A) and on the first
  against the injected one, exit codes and the TPOT rows kept;
- ``sweep``: ``python -m inferlab sweep --device cuda`` (the default GPU sweep), its wall time,
  every engine's verdicts and the fast engine's prepare time per configuration;
- ``sweep-inject``: the same with ``--inject-delay-per-position-us`` (a TPOT that grows with the
  context: "total latency grows linearly" must not hold for any engine).

Each finished step is kept in OUT/steps/ (never overwritten: a repeated step gets the next
number), so back-to-back calls add to one folder; OUT/summary.md and summary.json are rebuilt
from all of them at the end of every call. --budget-s is a deadline: a step still running then is
stopped, and a step is not started when a finished step of its kind took longer than what is left.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from inferlab.storage import write_json_atomic, write_text_atomic
from inferlab.suite import gate

REPO = Path(__file__).resolve().parents[2]
STEPS = ("suite", "suite-inject", "gate", "sweep", "sweep-inject")
SUITE = ["-m", "pytest", "--benchmark-autosave", "--benchmark-save-data", "-p", "no:cacheprovider", "-q"]


def run_step(name: str, argv: list[str], log: Path, timeout_s: float) -> dict:
    """Run `python argv` at the repository root; its wall time, exit code and log."""
    began = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as stopped:
        text = lambda part: part.decode(errors="replace") if isinstance(part, bytes) else (part or "")  # noqa: E731
        code, output = "timeout", text(stopped.stdout) + text(stopped.stderr)
    wall = time.perf_counter() - began
    log.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(log, output)
    print(f"{name}: exit {code}, {wall:.0f} s", flush=True)
    return {"step": name, "command": " ".join(["python3", *argv]), "exit": code, "wall_s": wall, "log": str(log)}


def saved_runs(storage: Path) -> list[Path]:
    """The suite runs saved so far, oldest first (pytest-benchmark numbers them 0001_, 0002_, ...)."""
    return sorted(storage.rglob("*.json"), key=lambda p: p.name)


def prepare_times_ms(saved: Path) -> dict[str, float]:
    """Each case's engine preparation (compile, graph capture) as the plugin saved it, by case id."""
    prepared = {}
    for entry in json.loads(saved.read_text()).get("benchmarks", []):
        case = case_id(entry["name"]).rsplit("-", 1)[0]  # fast-b1-p128-n10-tpot_ms -> fast-b1-p128-n10
        if "prepare_ms" in entry.get("extra_info", {}):
            prepared[case] = entry["extra_info"]["prepare_ms"]
    return prepared


def tpot_medians_ms(run: gate.Run) -> dict[str, float]:
    return {s.name: float(np.median(s.rounds_ms)) for s in run.series if s.metric == "tpot_ms"}


def injection_delay_ms(first_run: gate.Run, fraction: float) -> float:
    """`fraction` of the largest of the run's TPOT entries (each entry's median): every entry slows by at least it."""
    medians = tpot_medians_ms(first_run)
    if not medians:
        raise SystemExit(f"{first_run.path} has no tpot_ms entry: the suite must save TPOT to inject a slowdown")
    return fraction * max(medians.values())


def gate_rows(report_path: Path) -> list[dict]:
    """The median and tail rows of a gate JSON report: name, ratio, interval, verdict."""
    report = json.loads(report_path.read_text())
    keep = ("ratio", "ci_low", "ci_high", "verdict")
    return ([{"name": row["name"], **{k: row[k] for k in keep}} for row in report.get("rows", [])]
            + [{"name": f"{row['name']} {row['metric']}.{row['stat']}", **{k: row[k] for k in keep}}
               for row in report.get("tails", [])])


def sweep_result(folder: Path) -> dict:
    """Verdicts per engine and the fast engine's prepare time per configuration, from a sweep's sweep.json."""
    data = json.loads((folder / "sweep.json").read_text())
    verdicts = {f"{h['engine']} p{h['prompt_length']} b{h['batch_size']}": {v["name"]: v["verdict"] for v in h["verdicts"]}
                for h in data.get("hypotheses", [])}
    prepare = {f"{r['config']['engine']} n{r['config']['output_length']}": r.get("prepare_ms")
               for r in data.get("results", []) if r.get("prepare_ms") is not None}
    return {"folder": str(folder), "complete": data.get("complete"), "verdicts": verdicts, "prepare_ms": prepare}


def kind(step: str) -> str:
    """suite-inject-2 -> suite, sweep-1 -> sweep, gate-1 -> gate: steps of one kind take about as long."""
    return step.split("-")[0]


def expected_wall_s(records: list[dict], name: str) -> float | None:
    """The longest finished (exit 0) step of `name`'s kind so far, None before the first."""
    walls = [r["wall_s"] for r in records if kind(r.get("step", "")) == kind(name) and r.get("exit") == 0 and "wall_s" in r]
    return max(walls) if walls else None


def next_name(out: Path, name: str) -> str:
    """name-1, name-2, ...: the first number no step record or log of `out` uses."""
    taken = {p.stem for p in (out / "steps").glob("*.json")} | {p.stem for p in (out / "logs").glob("*.log")}
    return next(f"{name}-{i}" for i in range(1, 1000) if f"{name}-{i}" not in taken)


def do_step(name: str, out: Path, args, deadline: float) -> dict | None:
    storage = out / "benchmarks"
    steps = out / "steps"
    label = next_name(out, name)
    timeout = max(1.0, deadline - time.monotonic())
    if name in ("suite", "suite-inject"):
        extra = []
        if name == "suite-inject":
            runs = saved_runs(storage)
            if not runs:
                print("suite-inject: no suite run saved yet: run the step suite first", flush=True)
                return None
            delay = injection_delay_ms(gate.load_run(runs[0]), args.inject_fraction)
            extra = ["--inferlab-inject-delay-ms", f"{delay:.6f}"]
        before = set(saved_runs(storage))
        argv = [*SUITE, "-m", args.marker, f"--benchmark-storage={storage}", *shlex.split(args.suite_args), *extra]
        record = run_step(label, argv, out / "logs" / f"{label}.log", timeout)
        new = [p for p in saved_runs(storage) if p not in before]
        record["saved"] = str(new[0]) if new else None
        if new:
            record["prepare_ms"] = prepare_times_ms(new[0])
        if extra and new:
            record["delay_ms"] = float(extra[1])
            base = tpot_medians_ms(gate.load_run(saved_runs(storage)[0]))
            record["delay_fraction_per_entry"] = {n: record["delay_ms"] / ms for n, ms in base.items()}
    elif name == "gate":
        suites = [json.loads(p.read_text()) for p in sorted(steps.glob("suite-*.json"))]
        plain = [s["saved"] for s in suites if s["step"].startswith("suite-") and "delay_ms" not in s and s.get("saved")]
        injected = [s["saved"] for s in suites if "delay_ms" in s and s.get("saved")]
        record = {"step": label, "pairs": {}}
        pairs = {"A/A": plain[:2], "injected": [plain[0], injected[0]] if plain and injected else []}
        for kind, pair in pairs.items():
            if len(pair) != 2:
                continue
            report = out / "gates" / f"{label}-{kind.replace('/', '')}.json"
            report.parent.mkdir(parents=True, exist_ok=True)
            result = run_step(f"{label} {kind}", ["-m", "inferlab", "gate", pair[0], pair[1], "--json", str(report)],
                              out / "logs" / f"{label}-{kind.replace('/', '')}.log", timeout)
            result["rows"] = gate_rows(report) if report.exists() else []
            record["pairs"][kind] = result
    else:
        sweeps = out / "sweeps"
        before = set(sweeps.glob("*")) if sweeps.exists() else set()
        extra = ["--inject-delay-per-position-us", str(args.inject_us)] if name == "sweep-inject" else []
        argv = ["-m", "inferlab", "sweep", "--device", args.device, "--out", str(sweeps), *shlex.split(args.sweep_args), *extra]
        record = run_step(label, argv, out / "logs" / f"{label}.log", timeout)
        new = [p for p in sweeps.glob("*") if p not in before and (p / "sweep.json").exists()] if sweeps.exists() else []
        if new:
            record.update(sweep_result(new[0]))
        if extra:
            record["inject_delay_per_position_us"] = args.inject_us
    steps.mkdir(parents=True, exist_ok=True)
    write_json_atomic(steps / f"{label}.json", record)
    return record


def case_id(name: str) -> str:
    """test_decode_latency_gpu[fast-b1-p128-n10-tpot_ms] tpot_ms.p99 -> fast-b1-p128-n10-tpot_ms tpot_ms.p99"""
    head, _, rest = name.partition("[")
    return rest.replace("]", "", 1) if rest else head


def summary_markdown(records: list[dict]) -> str:
    lines = ["| step | exit | wall | result |", "|---|---|---|---|"]
    for r in records:
        if r["step"].startswith("gate"):
            for kind, pair in r["pairs"].items():
                verdicts = ", ".join(f"{case_id(row['name'])} {row['verdict']} ({row['ratio']:.4f})" for row in pair["rows"])
                lines.append(f"| {r['step']} {kind} | {pair['exit']} | {pair['wall_s']:.0f} s | {verdicts} |")
            continue
        if "verdicts" in r:
            result = "; ".join(f"{key}: " + ", ".join(v.split()[0] + "=" + verdict for v, verdict in vs.items())
                               for key, vs in r["verdicts"].items())
            prepare = ", ".join(f"{k} {v / 1e3:.1f} s" for k, v in r["prepare_ms"].items() if k.startswith("fast"))
            result += f"; fast prepare: {prepare}" if prepare else ""
        elif "delay_ms" in r:
            fractions = r["delay_fraction_per_entry"].values()
            result = f"+{r['delay_ms']:.4f} ms a step ({100 * min(fractions):.1f}-{100 * max(fractions):.1f}% of TPOT)"
        else:
            result = r.get("saved") or ""
            if r.get("prepare_ms"):
                result += "; prepare " + ", ".join(f"{case} {ms / 1e3:.1f} s" for case, ms in r["prepare_ms"].items())
        lines.append(f"| {r['step']} | {r['exit']} | {r['wall_s']:.0f} s | {result} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder; later calls add their steps to it")
    parser.add_argument("--steps", default="suite,suite,suite-inject,gate",
                        help=f"comma-separated, in order, from {', '.join(STEPS)} (default suite,suite,suite-inject,gate)")
    parser.add_argument("--budget-s", type=float, default=560, help="start no step after this many seconds")
    parser.add_argument("--inject-fraction", type=float, default=0.05, help="suite-inject: the delay as a fraction of TPOT")
    parser.add_argument("--inject-us", type=float, default=0.5, help="sweep-inject: microseconds per cache position")
    parser.add_argument("--marker", default="gpu", help="the suite's -m (default gpu: the design card's command)")
    parser.add_argument("--device", default="cuda", help="the sweep's --device (default cuda)")
    parser.add_argument("--suite-args", default="", help="more pytest arguments, to try the script on a CPU")
    parser.add_argument("--sweep-args", default="", help="more sweep arguments, to try the script on a CPU")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STEPS]
    if unknown or not chosen:
        parser.error(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        left = deadline - time.monotonic()
        done = [json.loads(p.read_text()) for p in (args.out / "steps").glob("*.json")]
        needs = expected_wall_s(done, name)
        if left <= 0 or (needs is not None and needs > left):
            # a step cut off by the deadline measures nothing: do not start one that would not fit
            why = f"needs ~{needs:.0f} s as before" if needs is not None else "nothing"
            print(f"{name}: skipped, {why}, {max(left, 0):.0f} s of --budget-s {args.budget_s:g} left", flush=True)
            continue
        do_step(name, args.out, args, deadline)
    records = [json.loads(p.read_text()) for p in sorted((args.out / "steps").glob("*.json"), key=lambda p: p.stat().st_mtime)]
    table = summary_markdown(records)
    write_text_atomic(args.out / "summary.md", table, overwrite=True)  # derived from steps/, rebuilt each call
    write_json_atomic(args.out / "summary.json", {"steps": records}, overwrite=True)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
