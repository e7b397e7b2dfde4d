"""`inferlab ab`: base and head run interleaved (ABBA) until the gate is decisive or a budget is spent.

The runner is injected: `runner(side, path)` runs the suite once for side "base" or "head" and
writes one pytest-benchmark JSON run (with raw data) to `path`. `command_runner` runs a shell
command per side; `worktree_runner` first checks out each git revision into its own worktree.

Order: pair i runs base then head for even i, head then base for odd i (ABBA), so neither side
always runs first. After every pair (from `min_pairs` on) the sequential look in
gate/sequential.py decides; the loop stops at a decisive verdict, at `max_pairs`, or when another
pair would pass `max_minutes` (judged by the mean pair so far).

Every finished run is kept: a run is written under a temporary name and published under
``base-NNN.json`` / ``head-NNN.json`` only once complete, never over a file, so an interrupt
(Ctrl-C) loses only the run in progress: `run_ab` then returns with stopped_by "interrupted", and
``ab.json`` records what was done and why it stopped.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from inferlab import storage
from inferlab.errors import UsageError
from inferlab.suite.gate.load import Run, load_run
from inferlab.suite.gate.sequential import Look, look
from inferlab.suite.gate.stats import CALIBRATION_CONFIDENCE, noise_upper_bound

Runner = Callable[[str, Path], None]


SIDES = ("base", "head")


DEFAULT_SUITE = f"{shlex.quote(sys.executable)} -m pytest perf_tests -m 'perf and not gpu and not slow' -p no:cacheprovider -q"


@dataclass(frozen=True)
class Plan:
    """When to look and when to stop."""

    thresholds: Mapping[str, float]
    confidence: float = 0.95
    min_pairs: int = 3
    max_pairs: int = 20
    max_minutes: float = 15.0

    def __post_init__(self) -> None:
        if self.min_pairs < 2:
            raise UsageError(f"--min-pairs must be at least 2 (a paired interval needs two pairs), got {self.min_pairs}")
        if self.max_pairs < self.min_pairs:
            raise UsageError(f"--max-pairs ({self.max_pairs}) must be at least --min-pairs ({self.min_pairs})")
        if not self.max_minutes > 0:
            raise UsageError(f"--max-minutes must be positive, got {self.max_minutes}")
        if not 0.5 <= self.confidence < 1:
            raise UsageError(f"--confidence must be in [0.5, 1), got {self.confidence}")

    @property
    def planned_looks(self) -> int:
        return self.max_pairs - self.min_pairs + 1


@dataclass
class Outcome:
    """What an A/B session did: its runs, its looks, and why it stopped."""

    folder: Path
    base_paths: list[Path] = field(default_factory=list)
    head_paths: list[Path] = field(default_factory=list)
    looks: list[Look] = field(default_factory=list)
    stopped_by: str = "running"
    seconds: float = 0.0

    @property
    def pairs(self) -> int:
        return min(len(self.base_paths), len(self.head_paths))

    @property
    def last(self) -> Look | None:
        return self.looks[-1] if self.looks else None


def order(pair: int) -> tuple[str, str]:
    """ABBA: (base, head) for even pairs, (head, base) for odd ones."""
    return SIDES if pair % 2 == 0 else SIDES[::-1]


def run_side(runner: Runner, side: str, folder: Path, index: int) -> Path:
    """Run one side into a temporary file, then publish it as `<side>-NNN.json` (never over a file)."""
    final = folder / f"{side}-{index:03d}.json"
    partial = folder / f".{side}-{index:03d}.partial.json"
    partial.unlink(missing_ok=True)
    try:
        runner(side, partial)
        if not partial.is_file():
            raise UsageError(f"the {side} suite wrote no run to {partial}: it must save pytest-benchmark JSON there")
        storage.write_bytes_atomic(final, partial.read_bytes())
    finally:
        partial.unlink(missing_ok=True)
    return final


def _pair_fits(outcome: Outcome, plan: Plan, elapsed: float) -> bool:
    if outcome.pairs >= plan.max_pairs:
        outcome.stopped_by = "max pairs"
        return False
    mean_pair = elapsed / outcome.pairs if outcome.pairs else 0.0
    if elapsed + mean_pair > plan.max_minutes * 60:
        outcome.stopped_by = "max minutes"
        return False
    return True


def run_ab(runner: Runner, plan: Plan, folder: Path, clock: Callable[[], float] = time.monotonic,
           on_look: Callable[[Outcome], None] | None = None) -> Outcome:
    """Run pairs until decisive or out of budget (see the module docstring); every finished run stays in `folder`."""
    outcome = Outcome(Path(folder))
    start = clock()
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}
    try:
        while _pair_fits(outcome, plan, clock() - start):
            pair = outcome.pairs
            for side in order(pair):
                path = run_side(runner, side, outcome.folder, pair + 1)
                (outcome.base_paths if side == "base" else outcome.head_paths).append(path)
                runs[side].append(load_run(path))
            if outcome.pairs >= plan.min_pairs:
                outcome.looks.append(look(runs["base"], runs["head"], plan.thresholds, plan.confidence, plan.planned_looks))
                if on_look is not None:
                    on_look(outcome)
                if outcome.last.decisive:
                    outcome.stopped_by = "decision"
                    break
    except KeyboardInterrupt:  # the runs finished so far are on disk; the caller reports them
        outcome.stopped_by = "interrupted"
    outcome.seconds = clock() - start
    return outcome


def command_runner(commands: Mapping[str, str], folders: Mapping[str, Path] | None = None,
                   env: Mapping[str, Mapping[str, str]] | None = None, logs: Path | None = None) -> Runner:
    """A runner that runs `commands[side]` in a shell, with {out} replaced by the run's path.

    A command without {out} gets ``--benchmark-json={out} --benchmark-save-data`` appended (a pytest
    command). With `logs`, each run's output goes to ``logs/<side>-NNN.log`` instead of the terminal."""
    counts = {side: 0 for side in SIDES}

    def run(side: str, path: Path) -> None:
        command = commands[side]
        if "{out}" not in command:
            command += " --benchmark-json={out} --benchmark-save-data"
        command = command.replace("{out}", shlex.quote(str(Path(path).resolve())))
        environment = {**os.environ, **(env or {}).get(side, {})}
        counts[side] += 1
        log = Path(logs) / f"{side}-{counts[side]:03d}.log" if logs is not None else None
        with open(log, "xb") if log is not None else contextlib.nullcontext() as output:
            done = subprocess.run(command, shell=True, cwd=(folders or {}).get(side), env=environment,
                                  stdout=output, stderr=subprocess.STDOUT if output else None)
        if done.returncode != 0 and not Path(path).is_file():
            where = f"; its output is in {log}" if log is not None else ""
            raise UsageError(f"the {side} suite command failed (exit {done.returncode}): {command}{where}")

    return run



def pytest_arguments(suite: str) -> list[str]:
    """The arguments of a pytest suite command (`python -m pytest ARGS` or `pytest ARGS`), for `forked_runner`."""
    words = shlex.split(suite)
    if len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1:3] == ["-m", "pytest"]:
        arguments = words[3:]
    elif words and Path(words[0]).name == "pytest":
        arguments = words[1:]
    else:
        raise UsageError(f"--fork runs pytest in a forked child: the suite must be `python -m pytest ...` or "
                         f"`pytest ...`, not {suite!r}")
    if any("{out}" in word for word in arguments):
        raise UsageError("--fork writes each run with --benchmark-json itself: leave {out} out of the suite")
    return arguments


def forked_runner(server, arguments: list[str], folders: Mapping[str, Path], logs: Path,
                  timeout_s: float = 3600.0) -> Runner:
    """`command_runner` for a pytest suite, each run in a child of `server` (an `inferlab.suite.forked.ForkServer`)
    at the side's folder, so that the libraries are imported once, not once per run; its output
    goes to ``logs/<side>-NNN.log``."""
    counts = {side: 0 for side in SIDES}

    def run(side: str, path: Path) -> None:
        counts[side] += 1
        log = Path(logs) / f"{side}-{counts[side]:03d}.log"
        code, _ = server.run([*arguments, f"--benchmark-json={Path(path).resolve()}", "--benchmark-save-data"],
                             folders[side], log, timeout_s)
        if code != 0 and not Path(path).is_file():
            raise UsageError(f"the {side} suite failed in its forked run (exit {code}); its output is in {log}")

    return run


def resolve_revision(repo: Path, revision: str) -> str:
    """The commit id of `revision` in `repo`; UsageError if git does not know it."""
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"{revision!r} is not a commit of the git repository at {repo}: pass a branch, tag or commit id")
    return done.stdout.strip()


def add_worktrees(repo: Path, revisions: Mapping[str, str], folder: Path) -> dict[str, Path]:
    """A detached worktree per side under `folder`/trees; the caller removes them with `remove_worktrees`."""
    trees = {}
    for side in SIDES:
        tree = Path(folder) / "trees" / side
        done = subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(tree.resolve()),
                               revisions[side]], capture_output=True, text=True)
        if done.returncode != 0:
            remove_worktrees(repo, trees)
            raise UsageError(f"git worktree add for {side} failed: {done.stderr.strip().splitlines()[-1:]}")
        trees[side] = tree.resolve()
    return trees


def remove_worktrees(repo: Path, trees: Mapping[str, Path]) -> None:
    for tree in trees.values():
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], capture_output=True)


def worktree_env(trees: Mapping[str, Path]) -> dict[str, dict[str, str]]:
    """PYTHONPATH per side: each side imports its own inferlab (and pytest plugin) from its worktree."""
    existing = os.environ.get("PYTHONPATH", "")
    return {side: {"PYTHONPATH": os.pathsep.join(p for p in (str(tree), existing) if p)} for side, tree in trees.items()}


def outcome_dict(outcome: Outcome, plan: Plan, sides: Mapping[str, str]) -> dict:
    """ab.json: what ran, every look, the final rows and why it stopped (schema inferlab.ab/1)."""
    last = outcome.last
    return {
        "schema": "inferlab.ab/1",
        "sides": dict(sides),
        "verdict": last.verdict if last else "INCONCLUSIVE",
        "stopped_by": outcome.stopped_by,
        "pairs": outcome.pairs,
        "seconds": outcome.seconds,
        "plan": {"confidence": plan.confidence, "min_pairs": plan.min_pairs, "max_pairs": plan.max_pairs,
                 "max_minutes": plan.max_minutes, "thresholds": dict(plan.thresholds),
                 "planned_looks": plan.planned_looks,
                 "method": "paired Student-t interval per look; Bonferroni over benchmarks and planned looks"},
        "base_runs": [str(p) for p in outcome.base_paths],
        "head_runs": [str(p) for p in outcome.head_paths],
        "looks": [{"pairs": l.rows[0].pairs, "level": l.level, "verdict": l.verdict,
                   "rows": [row.__dict__ for row in l.rows]} for l in outcome.looks],
    }


def measured_noise(outcome: Outcome) -> dict[str, float]:
    """Per benchmark, the run noise of the last look (sd of pair differences / sqrt 2)."""
    return {row.fullname: row.run_noise for row in outcome.last.rows} if outcome.last else {}


def calibrated_noise(outcome: Outcome, confidence: float = CALIBRATION_CONFIDENCE) -> dict[str, float]:
    """Per benchmark, the upper confidence bound of `measured_noise` (pairs - 1 degrees of freedom):
    what `inferlab gate --run-noise calibrated` is given."""
    if not outcome.last:
        return {}
    return {row.fullname: noise_upper_bound(row.run_noise, row.pairs - 1, confidence) for row in outcome.last.rows}


__all__ = ["DEFAULT_SUITE", "Outcome", "Plan", "Runner", "SIDES", "add_worktrees", "calibrated_noise", "command_runner",
           "forked_runner", "pytest_arguments",
           "measured_noise", "order", "outcome_dict", "remove_worktrees", "resolve_revision", "run_ab", "run_side", "worktree_env"]
