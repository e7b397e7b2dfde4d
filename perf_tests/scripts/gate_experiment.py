"""Does `inferlab gate` beat pytest-benchmark's single-run threshold? A/A false alarms and injected-slowdown detection.

    PYTHONPATH=. python perf_tests/scripts/gate_experiment.py --out results/gate-cpu            # CPU, ~25 min
    PYTHONPATH=. python perf_tests/scripts/gate_experiment.py --out results/gate-h200 --device cuda \\
        --engines eager --model tinyllama-1.1b-random --output-lengths 32,128

Every measurement is one pytest process on the perf tests (CPU: perf_tests/test_decode_cpu.py,
the tiny-random cases, -m "perf and not slow"; CUDA: perf_tests/test_decode_gpu.py, -m gpu),
saved with --benchmark-json and --benchmark-save-data into OUT/runs/. Slowdowns are injected
with the plugin's --inferlab-inject-delay-ms, a fixed delay added to every decode step (a host
busy-wait for host-bound engines, a CUDA sleep kernel on the stream for engines replaying CUDA
graphs: --inferlab-inject-on auto), so TPOT grows by that delay, e2e by
(n - 1) x delay, and TTFT not at all.

1. Calibration: --calibration-runs runs of the unchanged code. Their TPOT entries' medians give
   the reference TPOT that turns 5% and 10% into delays in ms; their spread gives each entry a
   calibrated run_noise (`gate.calibrated_run_noise`: the spread's 95% upper confidence bound, as
   `inferlab ab` saves it). No evaluation run is used for either.
2. Evaluation: --pairs blocks of four runs, A and A2 (unchanged), H5 and H10 (delay for 5% and
   10% of the reference TPOT). Block order alternates A H5 A2 H10 / H10 A2 H5 A (ABBA), so a
   slow drift of the machine does not favour base or head. Each block gives one A/A pair
   (A, A2), one 5% pair (A, H5) and one 10% pair (A2, H10); pairs of one kind share no run.
   `--injected 5` leaves H10 out (blocks of three runs: A H5 A2 / A2 H5 A).
3. Each pair is judged by pytest-benchmark's rule (--benchmark-compare-fail=median:T%), by the
   gate (run_noise: the 1% default; "calibrated", the largest entry's bound for every entry;
   "calibrated per benchmark", each entry's own, as `inferlab gate` applies a saved record) on the medians and on the p99 tails of
   TPOT rounds and ITL gaps (`inferlab.suite.gate.judge`, one Bonferroni family, as
   `inferlab gate` judges), and by the gate's intervals with the point-estimate FAIL rule
   (low > 1 and ratio >= 1 + T) for comparison; also by the gate on two runs per side (two
   consecutive blocks).

Reported: false alarms per suite (fraction of A/A pairs with any FAIL), detection rate on the
TPOT entries at 5% and 10% (and the fraction of pairs with any TPOT entry failing), the same
for the p99 tail rows of TPOT, and the INCONCLUSIVE rates. An A/A suite counts as failing when
any of its rows fails, tails included. Resumable: run again with --resume and the same --out; finished runs are
kept, never overwritten; the plan (delays, settings) is fixed in OUT/plan.json at the start.
The pytest processes run a copy of the code taken at the start (OUT/code), so edits to the
checkout while the experiment runs cannot change what is measured halfway.

`--fork` starts the runs from a server process that has imported torch, transformers, numpy and
pytest once, then forks a child per run (`inferlab.suite.forked`): the child initializes CUDA, loads the model,
compiles (from the on-disk caches) and captures its graphs as a fresh process does, so what is
measured is unchanged; the ~14 s of imports a process spent on an H100 host are paid once. On the
2-core CPU a tiny-model run went from 5.0-5.5 s to 3.1-3.2 s. Each run's meta says whether it
was forked.

`--combine DIR DIR ... --out NEW` runs nothing: it pools experiments of the same settings made
on several machines or sessions, each pair judged with its own experiment's calibration.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from inferlab.look import tables
from inferlab.suite import gate
from inferlab.suite.forked import ForkServer
from inferlab.suite.gate import simulate
from inferlab.suite.gate.judge import judge as judge_all
from inferlab.errors import UsageError
from inferlab.storage import write_json_atomic

REPO = Path(__file__).resolve().parents[2]

INJECTED = (0.05, 0.10)
BLOCK = ("A", "H5", "A2", "H10")  # reversed on odd blocks; H-labels not injected are left out
BASE_OF = {"H5": "A", "H10": "A2"}  # each injected run is paired with its own unchanged run


@dataclass(frozen=True)
class Setup:
    """What every pytest process of the experiment runs."""

    device: str
    engines: str | None
    model: str | None
    dtype: str | None
    output_lengths: str | None
    select: str | None
    rounds: int
    warmup: int
    threads: int | None

    @property
    def test_file(self) -> str:
        return "perf_tests/test_decode_gpu.py" if self.device.startswith("cuda") else "perf_tests/test_decode_cpu.py"

    @property
    def marker(self) -> str:
        return "gpu" if self.device.startswith("cuda") else "perf and not slow"


def pytest_command(setup: Setup, json_path: Path, delay_ms: float) -> list[str]:
    """The pytest command line for one run saving to `json_path` with `delay_ms` added per decode step."""
    command = [sys.executable, "-m", "pytest", setup.test_file, "-m", setup.marker, "-p", "no:cacheprovider", "-q",
               "--benchmark-json", str(json_path), "--benchmark-save-data",
               "--inferlab-device", setup.device, "--inferlab-rounds", str(setup.rounds),
               "--inferlab-warmup", str(setup.warmup), "--inferlab-inject-delay-ms", f"{delay_ms:.6f}",
               "--inferlab-inject-on", "auto",  # host for host-bound engines, the GPU stream for graph replay
               "--inferlab-costs", "off"]  # no energy block after each case: a shorter process, the same timings
    for option, value in (("--inferlab-engines", setup.engines), ("--inferlab-model", setup.model),
                          ("--inferlab-dtype", setup.dtype), ("--inferlab-output-lengths", setup.output_lengths),
                          ("-k", setup.select)):
        if value:
            command += [option, value]
    return command


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (user, nice, system, irq, softirq), from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return float("nan")  # not Linux: interference is not measured
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def other_cores(seconds: float) -> float:
    """Cores kept busy by other processes over the next `seconds` (this script sleeps meanwhile)."""
    before = busy_cpu_s()
    time.sleep(seconds)
    return (busy_cpu_s() - before) / seconds


def wait_for_quiet(max_wait_s: float, limit_cores: float) -> float:
    """Wait (at most max_wait_s) until other processes use < limit_cores; the seconds waited."""
    start = time.perf_counter()
    while max_wait_s > 0 and other_cores(2.0) >= limit_cores and time.perf_counter() - start < max_wait_s:
        time.sleep(8.0)
    return time.perf_counter() - start


SNAPSHOT = ("inferlab", "perf_tests", "conftest.py", "pyproject.toml")


def snapshot_code(folder: Path) -> dict:
    """Copy what the pytest processes import into `folder` (once): edits to the checkout during the experiment cannot reach it."""
    if not folder.exists():
        partial = folder.with_name(f".partial-{folder.name}")
        shutil.rmtree(partial, ignore_errors=True)  # ours, from an interrupted start
        partial.mkdir(parents=True)
        for name in SNAPSHOT:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(source, partial / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif source.exists():
                shutil.copy2(source, partial / name)
        partial.rename(folder)
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return {"code_sha256": digest.hexdigest(), "git_head": _git("rev-parse", "HEAD"),
            "git_dirty_files": _git("status", "--porcelain", "--untracked-files=no").splitlines()}


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_env(setup: Setup, code: Path) -> dict:
    """The environment of a run: the code snapshot first on the path, the run's threads."""
    env = dict(os.environ, PYTHONPATH=str(code) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if setup.threads:
        env.update(OMP_NUM_THREADS=str(setup.threads), MKL_NUM_THREADS=str(setup.threads))
    return env


def run_pytest(setup: Setup, path: Path, delay_ms: float, options: argparse.Namespace) -> gate.Run:
    """One pytest process saving to `path` (and its interference to `path`.meta); a saved run is loaded instead."""
    if path.exists():
        return gate.load_run(path)
    partial = path.with_name(f".partial-{path.name}")
    partial.unlink(missing_ok=True)  # ours, from an interrupted run
    code = options.out / "code"
    env = run_env(setup, code)
    waited = wait_for_quiet(options.quiet_wait_s, options.quiet_cores)
    command = pytest_command(setup, partial.resolve(), delay_ms)
    start, busy, ours = time.perf_counter(), busy_cpu_s(), children_cpu_s()
    if options.fork_server is not None:
        log = path.with_name(f".log-{path.stem}.txt")
        exit_code, run_cpu = options.fork_server.run(command[3:], code, log, options.run_timeout_s)  # after "python -m pytest"
        output = log.read_text(errors="replace")
        log.unlink()
    else:
        done = subprocess.run(command, cwd=code, env=env, capture_output=True, text=True, timeout=options.run_timeout_s)
        exit_code, run_cpu, output = done.returncode, children_cpu_s() - ours, done.stdout + done.stderr
    wall = time.perf_counter() - start
    # Everything the machine did during the run that was not this run: other users' jobs.
    other = (busy_cpu_s() - busy) - run_cpu
    if exit_code != 0 or not partial.exists():
        tail = "\n".join(output.splitlines()[-15:])
        raise RuntimeError(f"pytest for {path.name} exited with {exit_code}:\n{tail}")
    meta = {"wall_s": wall, "other_cpu_s": other, "other_cores": other / wall, "waited_for_quiet_s": waited,
            "delay_ms": delay_ms, "forked": options.fork_server is not None, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    write_json_atomic(path.with_suffix(".meta.json"), meta)
    os.link(partial, path)  # never replaces a finished run
    partial.unlink()
    print(f"  {path.name}: {wall:.0f} s, other processes {other / wall:.2f} cores, waited {waited:.0f} s", flush=True)
    return gate.load_run(path)


def injected_label(fraction: float) -> str:
    return f"H{round(100 * fraction)}"


def kind_of(fraction: float) -> str:
    return f"{round(100 * fraction)}%"


def block_labels(index: int, injected: tuple[float, ...] = INJECTED) -> tuple[str, ...]:
    """A H5 A2 H10 on even blocks, reversed on odd ones (ABBA against drift); the H-runs of `injected` only."""
    labels = tuple(label for label in BLOCK if label in ("A", "A2") or label in {injected_label(f) for f in injected})
    return labels if index % 2 == 0 else tuple(reversed(labels))


def tail_key(row) -> str:
    """The name a tail row's verdict is kept under: the entry, the metric of the tail and its quantile."""
    return f"{row.fullname}:{row.metric}.{row.stat}"


def tpot_names(run: gate.Run) -> list[str]:
    return [s.fullname for s in run.series if s.metric == "tpot_ms"]


def reference_tpot_ms(runs: list[gate.Run]) -> float:
    """Median over TPOT entries of each entry's median (over runs) of run medians."""
    names = tpot_names(runs[0])
    if not names:
        raise UsageError("no tpot_ms benchmark in the calibration runs: include TPOT in --inferlab-metrics")
    return float(np.median([np.median([run.get(n).median_ms for run in runs]) for n in names]))


def judge(base: list[gate.Run], head: list[gate.Run], threshold: float, confidence: float,
          noises: dict[str, float]) -> dict[str, dict[str, str]]:
    """method -> {fullname: verdict} for one pair (several runs per side allowed, except for pytest-benchmark)."""
    verdicts = {}
    if len(base) == 1:
        fails = gate.pytest_benchmark_style(base[0], head[0], threshold)
        verdicts["pytest-benchmark median"] = {n: gate.FAIL if f else gate.PASS for n, f in fails.items()}
    for label, noise in noises.items():
        judgement = judge_all(base, head, {"default": threshold}, confidence=confidence, run_noise=noise)
        report = judgement.medians
        verdicts[f"gate run_noise={label}"] = ({row.fullname: row.verdict for row in report.rows}
                                               | {tail_key(row): row.verdict for row in judgement.tails})
        verdicts[f"point rule run_noise={label}"] = {row.fullname: simulate.point_rule(row) for row in report.rows}
        verdicts[f"ratio run_noise={label}"] = {row.fullname: row.ratio for row in report.rows}
    return verdicts


def rates(pairs: list[dict[str, dict[str, str]]], method: str, entries: list[str]) -> dict[str, float]:
    """Fractions over pairs: any FAIL in the suite, suite INCONCLUSIVE, and FAIL / INCONCLUSIVE among `entries`."""
    suites = [gate.suite_verdict(list(p[method].values())) for p in pairs]
    chosen = [p[method][n] for p in pairs for n in entries]
    return {
        "pairs": len(pairs),
        "suite_fail": suites.count(gate.FAIL) / len(pairs),
        "suite_inconclusive": suites.count(gate.INCONCLUSIVE) / len(pairs),
        "suite_pass": suites.count(gate.PASS) / len(pairs),
        "entries_fail": chosen.count(gate.FAIL) / len(chosen),
        "entries_inconclusive": chosen.count(gate.INCONCLUSIVE) / len(chosen),
        "pairs_any_entry_fail": float(np.mean([any(p[method][n] == gate.FAIL for n in entries) for p in pairs])),
    }


def kind_rates(judged: dict[str, list], methods: list[str], names: list[str], tpot: list[str], ttft: list[str]) -> dict:
    """method -> {A/A, each injected kind on TPOT, on the p99 TPOT tails, and on TTFT (unaffected)} -> rates."""
    table = {}
    for method in methods:
        tails = [key for key in judged["A/A"][0][method] if ":tpot_ms." in key]
        row = {"A/A": rates(judged["A/A"], method, names)}
        for kind in (k for k in judged if k != "A/A"):
            row[kind] = rates(judged[kind], method, tpot)
            if tails:
                row[f"{kind} p99"] = rates(judged[kind], method, tails)
            row[f"{kind} TTFT (unaffected)"] = rates(judged[kind], method, ttft)
        table[method] = row
    return table


def experiment_noises(plan: dict) -> dict[str, float | dict[str, float]]:
    """The run_noise settings each pair is judged with: the 1% default; "calibrated", the largest
    calibrated bound, applied to every entry; and, where the plan keeps them, "calibrated per
    benchmark", each entry its own bound, as `inferlab gate` applies a record `inferlab ab` saved
    (a graph-replayed TPOT may spread 0.1% from process to process while the TTFT beside it spreads 2%)."""
    noises: dict[str, float | dict[str, float]] = {"default": gate.DEFAULT_RUN_NOISE,
                                                   "calibrated": plan["calibrated_run_noise"]}
    if plan.get("run_noise_per_benchmark"):
        noises["calibrated per benchmark"] = dict(plan["run_noise_per_benchmark"])
    return noises


def judged_pairs(plan: dict, calibration: list[gate.Run], blocks: list[dict[str, gate.Run]],
                 quiet: list[dict[str, bool]], confidence: float) -> dict[str, dict[str, list]]:
    """One experiment's pairs judged by every method: "one" run per side, "two" runs per side
    (consecutive blocks), "calm" (one per side, both runs quiet); each kind -> judged pairs."""
    noises = experiment_noises(plan)
    threshold = plan["threshold"]
    injected = tuple(plan.get("injected", INJECTED))
    kinds = {"A/A": ("A", "A2")} | {kind_of(f): (BASE_OF[injected_label(f)], injected_label(f)) for f in injected}
    one = {kind: [judge([b[base]], [b[head]], threshold, confidence, noises) for b in blocks]
           for kind, (base, head) in kinds.items()}
    two = {kind: [judge([blocks[i][base], blocks[i + 1][base]], [blocks[i][head], blocks[i + 1][head]], threshold,
                        confidence, {k: v for k, v in noises.items() if k != "default"})
                  for i in range(0, len(blocks) - 1, 2)]
           for kind, (base, head) in kinds.items()}
    calm = {kind: [p for p, q in zip(one[kind], quiet) if q[base] and q[head]] for kind, (base, head) in kinds.items()}
    return {"one": one, "two": two, "calm": calm}


def analyse(experiments: list[tuple[dict, list[gate.Run], list[dict[str, gate.Run]], list[dict[str, bool]]]],
            confidence: float) -> dict:
    """Every pair of every experiment (plan, calibration, blocks, quiet) judged with that
    experiment's own calibration, pooled; the rates the table shows (all pairs; and pairs of two
    quiet runs)."""
    pooled: dict[str, dict[str, list]] = {"one": {}, "two": {}, "calm": {}}
    for experiment in experiments:
        for part, kinds in judged_pairs(*experiment, confidence).items():
            for kind, pairs in kinds.items():
                pooled[part].setdefault(kind, []).extend(pairs)
    calibration = experiments[0][1]
    names = list(calibration[0].names)
    tpot = tpot_names(calibration[0])
    ttft = [s.fullname for s in calibration[0].series if s.metric == "ttft_ms"]
    judged, two, calm = pooled["one"], pooled["two"], pooled["calm"]
    methods = [m for m in judged["A/A"][0] if not m.startswith("ratio")]
    table = kind_rates(judged, methods, names, tpot, ttft)
    if two["A/A"]:
        two_methods = [m for m in two["A/A"][0] if not m.startswith("ratio")]
        table.update({f"{m}, 2 runs per side": r for m, r in kind_rates(two, two_methods, names, tpot, ttft).items()})
    if all(calm.values()):
        main_methods = [m for m in ("pytest-benchmark median", "gate run_noise=default", "gate run_noise=calibrated",
                                    "gate run_noise=calibrated per benchmark") if m in judged["A/A"][0]]
        table.update({f"{m}, quiet pairs only": r for m, r in kind_rates(calm, main_methods, names, tpot, ttft).items()})
    nominal = []
    for plan, _, blocks, _ in experiments:
        base_tpot = {n: float(np.median([b[k].get(n).median_ms for b in blocks for k in ("A", "A2")])) for n in tpot}
        nominal.append({"base_tpot_ms": base_tpot,
                        "nominal_tpot_slowdown": {kind_of(f): {n: plan["delays_ms"][kind_of(f)] / base_tpot[n] for n in tpot}
                                                  for f in plan.get("injected", INJECTED)}})
    realised = {kind: {n: float(np.median([p["ratio run_noise=default"][n] for p in judged[kind]])) for n in names}
                for kind in judged}
    return {"table": table, "experiments": nominal, "median_ratio_per_kind": realised}


def load_experiment(folder: Path, quiet_cores: float) -> tuple[dict, list[gate.Run], list[dict[str, gate.Run]],
                                                              list[dict[str, bool]]]:
    """An experiment's plan, calibration runs, complete blocks and their quiet flags, as saved in `folder`."""
    plan_path = folder / "plan.json"
    if not plan_path.is_file():
        raise UsageError(f"{folder} holds no plan.json: pass folders written by this script's --out")
    plan = json.loads(plan_path.read_text())
    runs = folder / "runs"
    calibration = [gate.load_run(p) for p in sorted(runs.glob("cal-*.json")) if not p.name.endswith(".meta.json")]
    injected = tuple(plan.get("injected", INJECTED))
    blocks, quiet = [], []
    for index in range(1000):
        labels = block_labels(index, injected)
        paths = {label: runs / f"b{index:02d}-{label}.json" for label in labels}
        if not all(path.is_file() for path in paths.values()):
            break  # the first incomplete block ends the experiment (an interrupted one keeps its finished blocks)
        blocks.append({label: gate.load_run(path) for label, path in paths.items()})
        metas = {label: runs / f"b{index:02d}-{label}.meta.json" for label in labels}
        quiet.append({label: (json.loads(m.read_text()).get("other_cores", 1.0) if m.is_file() else 1.0) < quiet_cores
                      for label, m in metas.items()})
    if len(calibration) < 2 or not blocks:
        raise UsageError(f"{folder} has {len(calibration)} calibration runs and {len(blocks)} complete blocks: "
                         "it needs at least 2 and 1")
    return plan, calibration, blocks, quiet


def format_table(summary: dict) -> str:
    """Markdown: one line per method; for each injected kind, its TPOT medians and (where judged) p99 tails."""
    first = next(iter(summary["table"].values()))
    kinds = [k for k in first if k != "A/A" and not k.endswith(("p99", "(unaffected)"))]
    header = ["method", "A/A: suites with a FAIL", "A/A: suites INCONCLUSIVE", "A/A: entries FAIL"]
    for kind in kinds:
        header += [f"{kind}: TPOT entries FAIL", f"{kind}: TPOT INCONCL.", f"{kind}: suites with a TPOT FAIL",
                   f"{kind}: p99 TPOT FAIL"]
    header.append("TTFT FAIL in injected pairs")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    for method, r in summary["table"].items():
        cells = [f"{method} (n={r['A/A']['pairs']})", pct(r["A/A"]["suite_fail"]), pct(r["A/A"]["suite_inconclusive"]),
                 pct(r["A/A"]["entries_fail"])]
        for kind in kinds:
            tail = r.get(f"{kind} p99")
            cells += [pct(r[kind]["entries_fail"]), pct(r[kind]["entries_inconclusive"]), pct(r[kind]["pairs_any_entry_fail"]),
                      pct(tail["entries_fail"]) if tail else "-"]
        cells.append(pct(float(np.mean([r[f"{kind} TTFT (unaffected)"]["entries_fail"] for kind in kinds]))))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def make_plan(args, setup: Setup, calibration: list[gate.Run]) -> dict:
    reference = reference_tpot_ms(calibration)
    noise = gate.calibrated_run_noise(calibration)  # the 95% upper bound of the spread, as `inferlab ab` saves it
    return {
        "setup": asdict(setup),
        "threshold": args.threshold,
        "reference_tpot_ms": reference,
        "injected": list(args.injected),
        "delays_ms": {kind_of(f): f * reference for f in args.injected},
        "run_noise_per_benchmark": noise,
        "run_noise_estimate_per_benchmark": gate.estimate_run_noise(calibration),
        "calibrated_run_noise": max(noise.values()),
        "calibration_runs": len(calibration),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }


def environment(run: gate.Run) -> dict:
    """The machine that made `run`, as its saved file says (pytest-benchmark's machine_info), so
    that --combine, run elsewhere, reports the machines that measured."""
    info = json.loads(run.path.read_text()).get("machine_info", {})
    return {"machine": dict(run.machine), "platform": f"{info.get('system', '?')} {info.get('release', '?')}",
            "cpu_count": info.get("cpu", {}).get("count"), "python": info.get("python_version")}


def injected_fractions(text: str) -> tuple[float, ...]:
    chosen = {part.strip() for part in text.split(",") if part.strip()}
    if not chosen or not chosen <= {"5", "10"}:
        raise argparse.ArgumentTypeError(f"--injected {text!r}: write 5,10 or 5 or 10")
    return tuple(f for f in INJECTED if str(round(100 * f)) in chosen)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a new folder (or an earlier one with --resume)")
    parser.add_argument("--resume", action="store_true", help="continue the experiment in an existing --out")
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="DIR",
                        help="run nothing: pool the experiments saved in these folders (e.g. one per machine or "
                             "session, each with its own calibration) into a summary in the new folder --out")
    parser.add_argument("--pairs", type=int, default=20, help="evaluation blocks: each one A/A, one 5%% and one 10%% pair")
    parser.add_argument("--calibration-runs", type=int, default=8)
    parser.add_argument("--injected", default="5,10", type=injected_fractions,
                        help="the slowdowns injected, in %% of the reference TPOT: 5,10 (default), 5 or 10")
    parser.add_argument("--time-budget-s", type=float, default=0, help="start no new block after this long (0: none)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N for the GPU tests")
    parser.add_argument("--engines", default=None, help="CUDA: --inferlab-engines (default eager); the CPU file has fixed cases")
    parser.add_argument("--model", default=None, help="--inferlab-model (default: the tests' own)")
    parser.add_argument("--dtype", default=None, help="--inferlab-dtype")
    parser.add_argument("--output-lengths", default=None, help="CUDA: --inferlab-output-lengths (default 32,128)")
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression to narrow the cases")
    parser.add_argument("--rounds", type=int, default=20, help="--inferlab-rounds (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="--inferlab-warmup (default 2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP/MKL threads of each pytest process (default 1 on CPU: see docs/perf/gate-cpu.md)")
    parser.add_argument("--threshold", type=float, default=0.05, help="the slowdown that counts, as a fraction (default 0.05)")
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--simulate", type=int, default=0, metavar="PAIRS",
                        help="no pytest: compare the FAIL rules on PAIRS synthetic pairs per true slowdown, run_noise known")
    parser.add_argument("--sim-run-noise", type=float, default=0.01, help="--simulate: run-to-run spread (default 0.01)")
    parser.add_argument("--sim-within", type=float, default=0.03, help="--simulate: round-to-round spread (default 0.03)")
    parser.add_argument("--run-timeout-s", type=float, default=600)
    parser.add_argument("--quiet-wait-s", type=float, default=300,
                        help="before each run, wait up to this long for other processes to go quiet (0: never wait)")
    parser.add_argument("--quiet-cores", type=float, default=0.2, help="quiet: other processes use fewer cores than this")
    parser.add_argument("--fork", action="store_true",
                        help="fork each run from a server that has imported torch and transformers once (no CUDA in "
                             "it): each run still has its own CUDA context, model, compile and graphs")
    args = parser.parse_args()
    if args.out.exists() and not args.resume:
        parser.error(f"{args.out} exists: choose a new --out, or pass --resume to continue that experiment")
    if args.pairs < 1 or args.calibration_runs < 2:
        parser.error("--pairs must be >= 1 and --calibration-runs >= 2")
    args.fork_server = None  # a ForkServer with --fork, once the experiment starts
    return args


def combine(args) -> int:
    """--combine: the experiments in those folders (one machine each, each with its own
    calibration) judged and pooled; the summary written to a new --out folder."""
    experiments = [load_experiment(folder, args.quiet_cores) for folder in args.combine]
    setups = {json.dumps(plan["setup"], sort_keys=True) for plan, *_ in experiments}
    if len(setups) > 1:
        raise UsageError("--combine: the experiments ran different settings (plan.json 'setup'): pool only repeats of one")
    summary = {"combined": [str(f) for f in args.combine], "plans": [plan for plan, *_ in experiments],
               "environments": [environment(cal[0]) for _, cal, _, _ in experiments],
               "blocks": [len(blocks) for _, _, blocks, _ in experiments], "confidence": args.confidence,
               **analyse(experiments, args.confidence)}
    args.out.mkdir(parents=True, exist_ok=False)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    saved = write_json_atomic(args.out / f"summary-{stamp}.json", summary)
    print(format_table(summary))
    print(f"\nsaved {saved}")
    return 0


def main() -> int:
    args = parse_args()
    if args.combine:
        return combine(args)
    if args.simulate:
        simulation = simulate.simulate(args.simulate, args.threshold, args.confidence, args.sim_run_noise, args.sim_within,
                              args.rounds)
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        saved = write_json_atomic(args.out / f"simulation-{stamp}.json", {**simulation, "command": " ".join(sys.argv)})
        print(tables.format_simulation(simulation))
        print(f"\nsaved {saved}")
        return 0
    start = time.perf_counter()
    cuda = args.device.startswith("cuda")
    setup = Setup(args.device, (args.engines or "eager") if cuda else args.engines, args.model, args.dtype,
                  (args.output_lengths or "32,128") if cuda else args.output_lengths, args.select, args.rounds,
                  args.warmup, args.threads if args.threads is not None else (None if cuda else 1))
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    plan_path = args.out / "plan.json"
    if plan_path.exists():
        plan = json.loads(plan_path.read_text())
        if not (args.out / "code").exists():
            raise SystemExit(f"{args.out / 'code'} is missing: the runs so far used that snapshot; start a new --out")
        setup = Setup(**plan["setup"])  # a resumed experiment keeps its first settings
        print(f"resuming {args.out}: settings and delays from {plan_path}", flush=True)
    code = snapshot_code(args.out / "code")
    print(f"code snapshot {args.out / 'code'} (sha256 {code['code_sha256'][:12]}, git {code['git_head'][:12]})", flush=True)
    if args.fork:
        try:
            args.fork_server = ForkServer(run_env(setup, args.out / "code"), cwd=REPO)
        except RuntimeError as error:
            print(f"--fork: {error}; each run starts its own process instead", flush=True)
    try:
        return run_experiment(args, setup, plan_path, runs_dir, code, start)
    finally:
        if args.fork_server is not None:
            args.fork_server.close()


def run_experiment(args, setup: Setup, plan_path: Path, runs_dir: Path, code: dict, start: float) -> int:
    """Calibration, then the evaluation blocks, then the summary (see the module's docstring)."""
    print(f"calibration: {args.calibration_runs} runs of the unchanged code", flush=True)
    calibration = [run_pytest(setup, runs_dir / f"cal-{i:02d}.json", 0.0, args)
                   for i in range(args.calibration_runs)]
    if plan_path.exists():
        plan = json.loads(plan_path.read_text())
    else:
        plan = {**make_plan(args, setup, calibration), **code}
        write_json_atomic(plan_path, plan)
    injected = tuple(plan.get("injected", INJECTED))  # a resumed experiment keeps its first arms
    delays = {"A": 0.0, "A2": 0.0} | {injected_label(f): plan["delays_ms"][kind_of(f)] for f in injected}
    print(f"reference TPOT {plan['reference_tpot_ms']:.4f} ms -> delays {plan['delays_ms']}; "
          f"calibrated run_noise {plan['calibrated_run_noise']:.4f}", flush=True)
    blocks = []
    for index in range(args.pairs):
        if args.time_budget_s and time.perf_counter() - start > args.time_budget_s:
            print(f"time budget reached after {index} blocks", flush=True)
            break
        print(f"block {index}: {' '.join(block_labels(index, injected))}", flush=True)
        blocks.append({label: run_pytest(setup, runs_dir / f"b{index:02d}-{label}.json", delays[label], args)
                       for label in block_labels(index, injected)})
    if not blocks:
        print("no evaluation block finished: raise --time-budget-s", file=sys.stderr)
        return 1
    metas = {path.name.removesuffix(".meta.json"): json.loads(path.read_text()) for path in runs_dir.glob("*.meta.json")}
    quiet = [{label: metas.get(f"b{i:02d}-{label}", {}).get("other_cores", 1.0) < args.quiet_cores for label in blocks[i]}
             for i in range(len(blocks))]
    summary = {"plan": plan, "environment": environment(calibration[0]), "blocks": len(blocks),
               "confidence": args.confidence, **analyse([(plan, calibration, blocks, quiet)], args.confidence),
               "interference_other_cores": {label: meta["other_cores"] for label, meta in sorted(metas.items())},
               "run_medians_ms": {path.stem: {s.name: s.median_ms for s in gate.load_run(path).series}
                                  for path in sorted(runs_dir.glob("*.json"))
                                  if not path.name.endswith(".meta.json") and not path.name.startswith(".")},  # not a .partial-
               "wall_s": time.perf_counter() - start}
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    saved = write_json_atomic(args.out / f"summary-{stamp}.json", summary)
    print()
    print(format_table(summary))
    print(f"\nsaved {saved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
