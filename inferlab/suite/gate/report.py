"""The gate's report as a text table and as JSON."""

from __future__ import annotations

from pathlib import Path

from inferlab.errors import UsageError
from inferlab.storage import write_json_atomic
from inferlab.suite.gate.verdict import FAIL, INCONCLUSIVE, PASS, Report

SCHEMA = "inferlab.gate/1"



def _percent(fraction: float) -> str:
    return f"{100 * fraction:.3g}%"



def format_table(report: Report) -> str:
    """One row per benchmark, then the suite verdict with counts, then what k, confidence and run_noise were."""
    level = f"CI {100 * report.level:.2f}%"
    header = ("benchmark", "metric", "base ms", "head ms", "ratio", level, "threshold", "verdict")
    cells = [
        (row.name, row.metric, f"{row.base_median_ms:.3f}", f"{row.head_median_ms:.3f}", f"{row.ratio:.3f}",
         f"{row.ci_low:.3f}-{row.ci_high:.3f}", _percent(row.threshold), row.verdict)
        for row in report.rows
    ]
    widths = [max(len(line[i]) for line in [header] + cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))).rstrip()
             for line in [header] + cells]
    lines.insert(1, "-" * len(lines[0]))
    counts = report.counts
    lines.append(f"gate: {report.verdict} ({counts[FAIL]} FAIL, {counts[INCONCLUSIVE]} INCONCLUSIVE, "
                 f"{counts[PASS]} PASS of {report.k} benchmarks)")
    lines.append(
        f"k = {report.k} benchmarks at family-wise confidence {_percent(report.confidence)}: each interval is "
        f"{100 * report.level:.2f}% (Bonferroni 1 - {1 - report.confidence:.3g}/{report.k}); "
        f"{len(report.base_paths)} base and {len(report.head_paths)} head run(s), {report.replicates} hierarchical-bootstrap "
        f"replicates, run_noise {_percent(report.run_noise)} per run. ratio = head / base (> 1: slower); "
        "FAIL: interval above 1 and reaching 1 + threshold; PASS: interval below 1 + threshold."
    )
    return "\n".join(lines)



def report_dict(report: Report) -> dict:
    """The report as JSON-ready data, schema inferlab.gate/1."""
    return {
        "schema": SCHEMA,
        "verdict": report.verdict,
        "exit_code": report.exit_code,
        "counts": report.counts,
        "settings": {
            "confidence": report.confidence,
            "k": report.k,
            "per_benchmark_level": report.level,
            "run_noise": report.run_noise,
            "replicates": report.replicates,
            "seed": report.seed,
            "thresholds": dict(report.thresholds),
            "rule": "PASS if ci_high < 1+threshold; FAIL if ci_low > 1; else INCONCLUSIVE",
        },
        "base_runs": list(report.base_paths),
        "head_runs": list(report.head_paths),
        "rows": [
            {
                "fullname": row.fullname, "name": row.name, "metric": row.metric,
                "base_median_ms": row.base_median_ms, "head_median_ms": row.head_median_ms,
                "ratio": row.ratio, "ci_low": row.ci_low, "ci_high": row.ci_high,
                "threshold": row.threshold, "verdict": row.verdict,
                "base_rounds_ms": [list(r) for r in row.base_rounds_ms],
                "head_rounds_ms": [list(r) for r in row.head_rounds_ms],
            }
            for row in report.rows
        ],
    }



def write_report_json(report: Report, path: Path) -> Path:
    """Write `report_dict(report)` to a new file; UsageError if it exists or its folder does not."""
    path = Path(path)
    if not path.parent.is_dir():
        raise UsageError(f"folder {path.parent} does not exist: create it or choose another --json path")
    return write_json_atomic(path, report_dict(report))
