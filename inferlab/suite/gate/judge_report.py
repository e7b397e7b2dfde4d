"""A judgement as text tables and as JSON (schema inferlab.gate/2: gate/1 plus tails, budgets, drift)."""

from __future__ import annotations

from pathlib import Path

from inferlab.errors import UsageError
from inferlab.storage import write_json_atomic
from inferlab.suite.gate.judge import Judgement
from inferlab.suite.gate.report import report_dict
from inferlab.suite.gate.verdict import FAIL, INCONCLUSIVE, PASS

SCHEMA = "inferlab.gate/2"


def _table(header: tuple[str, ...], cells: list[tuple[str, ...]], left: int) -> list[str]:
    widths = [max(len(line[i]) for line in [header] + cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
             for line in [header] + cells]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def _relative_cells(judgement: Judgement) -> list[tuple[str, ...]]:
    cells = []
    for row in judgement.medians.rows:
        cells.append((row.name, row.metric, "median", f"{row.base_median_ms:.3f}", f"{row.head_median_ms:.3f}",
                      f"{row.ratio:.3f}", f"{row.ci_low:.3f}-{row.ci_high:.3f}", f"{100 * row.threshold:.3g}%", row.verdict))
    for row in judgement.tails:
        cells.append((row.name, row.metric, row.stat, f"{row.base_ms:.3f}", f"{row.head_ms:.3f}",
                      f"{row.ratio:.3f}", f"{row.ci_low:.3f}-{row.ci_high:.3f}", f"{100 * row.threshold:.3g}%", row.verdict))
    for row in judgement.drift:
        cells.append((row.name, row.metric, "drift", f"{row.base_median_ms:.3f}", f"{row.head_median_ms:.3f}",
                      f"{row.ratio:.3f}", f"{row.ci_low:.3f}-{row.ci_high:.3f}", f"{100 * row.threshold:.3g}%", row.verdict))
    return cells


def format_judgement(judgement: Judgement) -> str:
    """Relative rows (median, tails, drift), then budgets, then the verdict and the settings."""
    report = judgement.medians
    level = f"CI {100 * report.level:.2f}%"
    lines = _table(("benchmark", "metric", "stat", "base ms", "head ms", "ratio", level, "threshold", "verdict"),
                   _relative_cells(judgement), left=3)
    if judgement.budgets:
        cells = [(row.name, row.budget.text, row.budget.source, f"{row.value_ms:.3f}",
                  f"{row.ci_low_ms:.3f}-{row.ci_high_ms:.3f}", f"{row.limit_ms:.3f}", row.verdict) for row in judgement.budgets]
        lines += [""] + _table(("benchmark", "budget", "from", "head ms", f"{level} ms", "limit ms", "verdict"), cells, left=3)
    counts = {v: judgement.verdicts.count(v) for v in (FAIL, INCONCLUSIVE, PASS)}
    lines.append(f"gate: {judgement.verdict} ({counts[FAIL]} FAIL, {counts[INCONCLUSIVE]} INCONCLUSIVE, "
                 f"{counts[PASS]} PASS of {judgement.k} verdicts)")
    noise = (f"run_noise {100 * report.run_noise:.3g}%" if len(set(judgement.run_noise.values())) <= 1
             else f"run_noise per benchmark (calibrated), up to {100 * report.run_noise:.3g}%")
    drift = (f", {len(judgement.drift)} drift against {len(judgement.reference_paths)} reference run(s)"
             if judgement.drift else "")
    lines.append(
        f"k = {judgement.k} verdicts ({len(report.rows)} medians, {len(judgement.tails)} tails, {len(judgement.budgets)} "
        f"budgets{drift}) at family-wise confidence {100 * report.confidence:.3g}%: each interval is "
        f"{100 * report.level:.2f}% (Bonferroni); {len(report.base_paths)} base and {len(report.head_paths)} head run(s), "
        f"{report.replicates} hierarchical-bootstrap replicates, {noise}. ratio = head / base (> 1: slower); "
        "drift: head / reference, threshold = the drift budget; budgets: PASS if the interval is within the limit."
    )
    return "\n".join(lines)


def judgement_dict(judgement: Judgement) -> dict:
    """gate/1's fields (rows = the medians) plus tails, budgets, drift and the overall verdict."""
    data = report_dict(judgement.medians)
    data.update(schema=SCHEMA, verdict=judgement.verdict, exit_code=judgement.exit_code, k=judgement.k,
                counts={v: judgement.verdicts.count(v) for v in (FAIL, INCONCLUSIVE, PASS)},
                run_noise=dict(judgement.run_noise), reference_runs=list(judgement.reference_paths),
                drift_budget=judgement.drift_budget)
    data["tails"] = [{"fullname": r.fullname, "name": r.name, "metric": r.metric, "stat": r.stat, "base_ms": r.base_ms,
                      "head_ms": r.head_ms, "ratio": r.ratio, "ci_low": r.ci_low, "ci_high": r.ci_high,
                      "threshold": r.threshold, "verdict": r.verdict} for r in judgement.tails]
    data["budgets"] = [{"fullname": r.fullname, "name": r.name, "budget": r.budget.text, "source": r.budget.source,
                        "metric": r.budget.metric, "stat": r.budget.stat, "value_ms": r.value_ms, "ci_low_ms": r.ci_low_ms,
                        "ci_high_ms": r.ci_high_ms, "limit_ms": r.limit_ms, "verdict": r.verdict} for r in judgement.budgets]
    data["drift"] = [{"fullname": r.fullname, "name": r.name, "metric": r.metric, "reference_median_ms": r.base_median_ms,
                      "head_median_ms": r.head_median_ms, "ratio": r.ratio, "ci_low": r.ci_low, "ci_high": r.ci_high,
                      "budget": r.threshold, "verdict": r.verdict} for r in judgement.drift]
    return data


def write_judgement_json(judgement: Judgement, path: Path) -> Path:
    """Write `judgement_dict` to a new file; UsageError if it exists or its folder does not."""
    path = Path(path)
    if not path.parent.is_dir():
        raise UsageError(f"folder {path.parent} does not exist: create it or choose another --json path")
    return write_json_atomic(path, judgement_dict(judgement))
