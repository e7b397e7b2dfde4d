"""`inferlab ab` output: a progress line per look and the final table."""

from __future__ import annotations

from inferlab.suite.ab import Outcome, Plan


def format_look_line(outcome: Outcome) -> str:
    """'pair 4 (2:13): INCONCLUSIVE; widest interval 0.93-1.12; MDE 8.1%'"""
    last = outcome.last
    widest = max(last.rows, key=lambda r: r.ci_high / r.ci_low)
    return (f"pair {outcome.pairs}: {last.verdict}; widest interval {widest.ci_low:.3f}-{widest.ci_high:.3f} "
            f"({widest.name}); largest MDE {100 * max(r.mde for r in last.rows):.3g}%")


def format_outcome(outcome: Outcome, plan: Plan) -> str:
    """Per benchmark: ratio, interval, threshold, verdict, MDE and run noise; then why it stopped."""
    last = outcome.last
    lines = []
    if last is not None:
        header = ("benchmark", "metric", "pairs", "ratio", f"CI {100 * last.level:.3f}%", "threshold", "MDE", "run noise", "verdict")
        cells = [(r.name, r.metric, str(r.pairs), f"{r.ratio:.3f}", f"{r.ci_low:.3f}-{r.ci_high:.3f}",
                  f"{100 * r.threshold:.3g}%", f"{100 * r.mde:.3g}%", f"{100 * r.run_noise:.3g}%", r.verdict) for r in last.rows]
        widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
        for row in [header, *cells]:
            lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        lines.insert(1, "-" * len(lines[0]))
    verdict = last.verdict if last else "INCONCLUSIVE"
    lines.append(f"ab: {verdict} after {outcome.pairs} pair(s) in {outcome.seconds / 60:.1f} min, stopped by {outcome.stopped_by} "
                 f"(budget {plan.max_pairs} pairs, {plan.max_minutes:g} min)")
    lines.append(f"method: paired t-interval per look, Bonferroni over benchmarks and {plan.planned_looks} planned looks "
                 f"(family-wise confidence {100 * plan.confidence:.3g}% however early it stops); MDE: slowdown found with "
                 "80% power at these pairs; run noise: sd of pair differences / sqrt 2 (use as the gate's --run-noise)")
    return "\n".join(lines)
