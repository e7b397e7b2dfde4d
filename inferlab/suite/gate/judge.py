"""Every verdict of one gate: medians, tails, absolute budgets and drift against a pinned reference.

All of them form one Bonferroni family: with k verdicts in all and family-wise confidence c,
each interval has level 1 - (1 - c) / k, so that with probability >= c none misses.

- medians: `verdict` rows, head against base (the package docstring);
- tails: `tails` rows, p99 of TPOT rounds and of ITL gaps (``tails=("p99",)``);
- budgets: `budgets` rows, on the head runs alone;
- drift: head against the reference runs with threshold `drift_budget`: the cumulative slowdown
  since the reference, which no chain of base/head pairs sees (ten 1% slips each pass).

run_noise may be one fraction or one per benchmark fullname (a calibrated record); a benchmark
missing from the mapping takes its largest value.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

from inferlab.errors import UsageError
from inferlab.suite.gate.budgets import Budget, BudgetRow, applies, budget_row, saved_budgets
from inferlab.suite.gate.extras import Extras, read_extras
from inferlab.suite.gate.load import Run, check_comparable
from inferlab.suite.gate.stats import DEFAULT_RUN_NOISE, bonferroni_level, replicates_for
from inferlab.suite.gate.tails import TAIL_METRICS, TailRow, planned_tails, tail_row
from inferlab.suite.gate.thresholds import DEFAULT_THRESHOLD
from inferlab.suite.gate.verdict import EXIT_CODES, Report, Row, _check_settings, _row, suite_verdict


@dataclass(frozen=True)
class Judgement:
    """The median report plus tail, budget and drift rows, judged as one family."""

    medians: Report
    tails: tuple[TailRow, ...]
    budgets: tuple[BudgetRow, ...]
    drift: tuple[Row, ...]
    drift_budget: float | None
    reference_paths: tuple[str, ...]
    run_noise: Mapping[str, float]

    @property
    def k(self) -> int:
        return len(self.medians.rows) + len(self.tails) + len(self.budgets) + len(self.drift)

    @property
    def verdicts(self) -> list[str]:
        return [r.verdict for r in (*self.medians.rows, *self.tails, *self.budgets, *self.drift)]

    @property
    def verdict(self) -> str:
        return suite_verdict(self.verdicts)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


def noise_for(run_noise: float | Mapping[str, float], fullname: str) -> float:
    """The run noise of one benchmark: the single value, or its own in a mapping, else the mapping's largest."""
    if isinstance(run_noise, Mapping):
        return float(run_noise.get(fullname, max(run_noise.values())))
    return float(run_noise)


def check_thresholds(thresholds: Mapping[str, float], metrics: set[str]) -> None:
    """UsageError for a threshold naming a metric (or metric.stat) no benchmark measures."""
    known = metrics | ({"itl_ms"} if "tpot_ms" in metrics else set())
    unknown = sorted(key for key in thresholds if key != "default" and key.split(".")[0] not in known)
    if unknown:
        raise UsageError(f"--threshold names {', '.join(unknown)}, which no benchmark measures "
                         f"(these measure {', '.join(sorted(known))}): fix the metric name")


def planned_budgets(head: Sequence[tuple[Run, Extras]], budgets: Sequence[Budget]) -> list[tuple[str, Budget]]:
    """(fullname, budget) for each given budget that matches an entry, and each budget saved with an entry.

    UsageError for a given budget that matches no entry (a typo would otherwise pass silently)."""
    run, extras = head[0]
    planned = [(s.fullname, b) for b in budgets for s in run.series if applies(b, s.name, s.metric)]
    for budget in budgets:
        if not any(b is budget for _, b in planned):
            raise UsageError(f"--budget {budget.pattern}:{budget.text} matches no benchmark of {run.path}: "
                             "check the pattern against the case ids (e.g. fast-b1-p128-n128-tpot_ms)")
    for series in run.series:
        planned.extend((series.fullname, b) for b in saved_budgets(extras, series.fullname) if applies(b, series.name, series.metric))
    return planned


def judge(
    base_runs: Sequence[Run], head_runs: Sequence[Run], thresholds: Mapping[str, float] | None = None,
    confidence: float = 0.95, run_noise: float | Mapping[str, float] = DEFAULT_RUN_NOISE, seed: int = 0,
    tails: Sequence[str] = ("p99",), budgets: Sequence[Budget] = (), reference_runs: Sequence[Run] = (),
    drift_budget: float | None = None,
) -> Judgement:
    """Judge head against base on every count the module docstring lists."""
    thresholds = dict(thresholds or {"default": DEFAULT_THRESHOLD})
    noises = dict(run_noise) if isinstance(run_noise, Mapping) else {}
    for noise in noises.values() if noises else [run_noise]:
        _check_settings(confidence, noise)
    check_comparable(base_runs, head_runs)
    if drift_budget is not None and not reference_runs:
        raise UsageError("--drift-budget needs --reference RUN.json: the pinned run the cumulative slowdown is measured from")
    if reference_runs:
        check_comparable(reference_runs, head_runs)
    names = base_runs[0].names
    check_thresholds(thresholds, {base_runs[0].get(n).metric for n in names})
    base = [(run, read_extras(run)) for run in base_runs]
    head = [(run, read_extras(run)) for run in head_runs]
    tail_plan = planned_tails(base + head, tails)
    budget_plan = planned_budgets(head, budgets)
    drift_names = names if reference_runs and drift_budget is not None else ()
    k = len(names) + len(tail_plan) + len(budget_plan) + len(drift_names)
    level = bonferroni_level(confidence, k)
    replicates = replicates_for(level)

    medians = tuple(_row(n, base_runs, head_runs, thresholds, level, replicates, noise_for(run_noise, n), seed) for n in names)
    tail_rows = tuple(tail_row(n, metric, stat, base, head, thresholds, level, replicates, noise_for(run_noise, n), seed)
                      for n, metric, stat in tail_plan)
    budget_rows = tuple(budget_row(n, b, head, level, replicates, noise_for(run_noise, n), seed) for n, b in budget_plan)
    drift = tuple(_row(n, reference_runs, head_runs, {"default": drift_budget}, level, replicates, noise_for(run_noise, n), seed)
                  for n in drift_names)
    shown_noise = max(noises.values()) if noises else float(run_noise)
    report = Report(medians, confidence, shown_noise, level, replicates, seed, MappingProxyType(thresholds),
                    tuple(str(r.path) for r in base_runs), tuple(str(r.path) for r in head_runs))
    per_benchmark = MappingProxyType({n: noise_for(run_noise, n) for n in names})
    return Judgement(report, tail_rows, budget_rows, drift, drift_budget, tuple(str(r.path) for r in reference_runs), per_benchmark)


__all__ = ["Judgement", "TAIL_METRICS", "judge", "noise_for"]
