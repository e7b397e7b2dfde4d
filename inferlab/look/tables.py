"""Text, CSV and Markdown tables for bench and sweep results (the CLI prints them; nothing here prints)."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Sequence

from inferlab.measure.bench import BenchResult

if TYPE_CHECKING:
    from inferlab.suite.sweep import GroupVerdicts, SweepConfig, SweepReport

METRIC_ROWS = (
    ("TTFT (ms)", "ttft_ms"),
    ("TPOT (ms)", "tpot_ms"),
    ("ITL (ms, all gaps)", "itl_ms"),
    ("total latency (ms)", "e2e_ms"),
    ("output tok/s per sequence", "output_tokens_per_s"),
    ("throughput tok/s", "throughput_tokens_per_s"),
)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_result(result: BenchResult) -> str:
    """A header naming what was measured, the p50/p95/p99 table, and the roofline."""
    fp, config = result.fingerprint, result.config
    lines = [
        f"{fp['model']} ({fp['dtype']}) on {fp['device_name']}{_layout(fp)} | engine {config.engine} | batch {config.batch_size} | "
        f"prompt {result.prompt_length} | output {config.output_length} tokens | {config.sampling.describe()}",
    ]
    if result.status != "ok":
        lines.append(f"{result.status.upper()}: {result.error}")
        return "\n".join(lines)
    lines.append(
        f"{len(result.runs)} measured runs after {config.warmup_runs} warm-up; prepare {result.prepare_ms:.0f} ms; "
        f"timer: {'CUDA events' if fp['device_type'] == 'cuda' else 'perf_counter'}"
        f"{'' if config.per_token_events else ' (first and last token only)'}"
    )
    summary = result.summary
    header = f"{'metric':<27}{'p50':>11}{'p95':>11}{'p99':>11}{'mean':>11}{'min':>11}{'max':>11}"
    lines += [header, "-" * len(header)]
    for label, key in METRIC_ROWS:
        stats = summary.get(key)
        if stats is None:
            continue
        lines.append(f"{label:<27}" + "".join(f"{_fmt(stats[k]):>11}" for k in ("p50", "p95", "p99", "mean", "min", "max")))
    lines.append(f"decode tok/s (1/TPOT p50): {_fmt(summary.get('decode_tokens_per_s'), 1)}")
    line = result.roofline_summary()
    if line:
        bandwidth = "unknown" if line["bandwidth_gb_per_s"] is None else f"{line['bandwidth_gb_per_s']:.0f} GB/s ({line['bandwidth_source']})"
        fraction = "-" if line["fraction_of_peak"] is None else f"{100 * line['fraction_of_peak']:.1f}%"
        lines.append(
            f"roofline: {line['bytes_per_step'] / 1e6:.1f} MB read per decode step "
            f"(weights {line['weight_bytes_per_step'] / 1e6:.1f} MB + KV {line['kv_bytes_per_step'] / 1e6:.2f} MB); "
            f"achieved {line['achieved_gb_per_s']:.1f} GB/s = {fraction} of {bandwidth}; "
            f"floor TPOT {_fmt(line['floor_tpot_ms'], 3)} ms"
        )
    lines.append(wall_check_line(result))
    lines += cost_lines(result)
    return "\n".join(lines)


def _mib(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 2**20:,.1f} MiB" if value >= 2**20 else f"{value / 2**10:,.1f} KiB"


def memory_line(usage) -> str:
    """Device peaks (CUDA) or the process's peak RSS, weights and the KV cache at the final length."""
    if usage.peak_allocated_bytes is not None:
        peaks = f"peak allocated {_mib(usage.peak_allocated_bytes)}, reserved {_mib(usage.peak_reserved_bytes)}; "
    else:
        peaks = ""
    return (f"memory: {peaks}weights {_mib(usage.weight_bytes)}; KV cache at the final length "
            f"{_mib(usage.kv_cache_bytes)}; process peak RSS {_mib(usage.peak_rss_bytes)}")


def energy_line(reading) -> str:
    """J/token and mean W with the counter's resolution and update interval, or why there is none."""
    if not hasattr(reading, "joules"):
        return f"energy: {reading.reason}"
    interval = "-" if reading.update_interval_s is None else f"{reading.update_interval_s * 1e3:.0f} ms"
    spread = "" if reading.relative_uncertainty is None else f" (+-{100 * reading.relative_uncertainty:.1f}%)"
    return (f"energy: {_fmt(reading.joules_per_token, 4)} J/token{spread}, mean {_fmt(reading.mean_watts, 1)} W "
            f"over {reading.seconds:.2f} s and {reading.output_tokens} output tokens (NVML counter: 1 mJ resolution, "
            f"updated every {interval}; whole board)")


def profile_lines(summary, top: int = 10) -> list[str]:
    """The top kernels (or CPU operators) by time per recorded step."""
    what = "kernels by device time" if summary.unit == "kernels" else "CPU operators by self time"
    total = sum(r.us_per_step for r in summary.rows)
    lines = [f"profile: top {what} per step, {summary.window} ({summary.steps} steps); trace {summary.trace}",
             f"  {'us/step':>10} {'share':>7} {'calls/step':>10}  name"]
    for item in summary.rows[:top]:
        share = 100 * item.us_per_step / total if total else 0.0
        lines.append(f"  {item.us_per_step:>10.1f} {share:>6.1f}% {item.calls_per_step:>10.1f}  {item.name[:100]}")
    return lines


def cost_lines(result: BenchResult) -> list[str]:
    lines = []
    if result.memory is not None:
        lines.append(memory_line(result.memory))
    if result.energy is not None:
        lines.append(energy_line(result.energy))
    if result.profile is not None:
        lines += profile_lines(result.profile)
    return lines


def wall_check_line(result: BenchResult) -> str:
    """TPOT from per-token timestamps against one synchronized host clock over each whole request."""
    pairs = [(r.tpot_ms, (r.wall_ms - r.ttft_ms) / (r.num_tokens - 1)) for r in result.runs if r.wall_ms and r.num_tokens > 1]
    if not pairs:
        return "wall-clock check: -"
    worst = max(abs(wall - timed) / timed for timed, wall in pairs if timed > 0)
    return f"wall-clock check: TPOT from a synchronized host clock differs from the timestamps' by at most {100 * worst:.2f}%"


def _layout(fp: dict) -> str:
    layout = fp.get("layout", "single")
    return "" if layout == "single" else f" ({layout})"


# ----------------------------------------------------------------------------- sweep


def title(fp: dict) -> str:
    return f"{fp['model']} ({fp['dtype']}) on {fp['device_name']}"


CSV_FIELDS = (
    "engine", "batch_size", "prompt_length", "output_length", "status",
    "ttft_ms_p50", "ttft_ms_p95", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p95", "tpot_ms_p99",
    "itl_ms_p50", "itl_ms_p99", "e2e_ms_p50", "e2e_ms_p95", "e2e_ms_p99",
    "output_tokens_per_s_p50", "decode_tokens_per_s", "achieved_gb_per_s", "percent_of_peak",
    "peak_allocated_mib", "peak_reserved_mib", "weight_mib", "kv_cache_mib", "peak_rss_mib",
    "joules_per_token", "mean_watts", "error",
)


def _mib_or_none(value: int | None) -> float | None:
    return None if value is None else value / 2**20


def cost_row(result: BenchResult) -> dict:
    """Memory (MiB) and energy figures of one configuration; None where not measured."""
    usage, reading = result.memory, result.energy
    fields = ("peak_allocated", "peak_reserved", "weight", "kv_cache", "peak_rss")
    values = {f"{name}_mib": None if usage is None else _mib_or_none(getattr(usage, f"{name}_bytes")) for name in fields}
    measured = reading is not None and hasattr(reading, "joules")
    values["joules_per_token"] = reading.joules_per_token if measured else None
    values["mean_watts"] = reading.mean_watts if measured else None
    return values


def row(result: BenchResult) -> dict:
    """One configuration's row: the figures every table shows (None where there is none)."""
    config, summary = result.config, result.summary

    def stat(key: str, percentile: str) -> float | None:
        return summary[key][percentile] if summary.get(key) else None

    line = result.roofline_summary() or {}
    fraction = line.get("fraction_of_peak")
    return {
        "engine": config.engine, "batch_size": config.batch_size, "prompt_length": result.prompt_length,
        "output_length": config.output_length, "status": result.status,
        **{f"{key}_{p}": stat(key, p) for key in ("ttft_ms", "tpot_ms") for p in ("p50", "p95", "p99")},
        "itl_ms_p50": stat("itl_ms", "p50"), "itl_ms_p99": stat("itl_ms", "p99"),
        **{f"e2e_ms_{p}": stat("e2e_ms", p) for p in ("p50", "p95", "p99")},
        "output_tokens_per_s_p50": stat("output_tokens_per_s", "p50"),
        "decode_tokens_per_s": summary.get("decode_tokens_per_s"),
        "achieved_gb_per_s": line.get("achieved_gb_per_s"),
        "percent_of_peak": None if fraction is None else 100 * fraction,
        **cost_row(result),
        "error": result.error,
    }


def csv_text(results: Sequence[BenchResult]) -> str:
    """One CSV row per configuration; empty cells where a figure does not exist."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for values in map(row, results):
        writer.writerow({k: "" if v is None else (f"{v:.4f}" if isinstance(v, float) else v) for k, v in values.items()})
    return buffer.getvalue()


# (header, row key, format): the columns of the text and Markdown tables
TABLE_COLUMNS = (
    ("TTFT p50 ms", "ttft_ms_p50", "{:.2f}"),
    ("TPOT p50 ms", "tpot_ms_p50", "{:.3f}"),
    ("TPOT p99 ms", "tpot_ms_p99", "{:.3f}"),
    ("E2E p50 ms", "e2e_ms_p50", "{:.1f}"),
    ("tok/s p50", "output_tokens_per_s_p50", "{:.1f}"),
    ("GB/s", "achieved_gb_per_s", "{:.1f}"),
    ("% peak", "percent_of_peak", "{:.1f}%"),
    ("GPU peak MiB", "peak_allocated_mib", "{:,.0f}"),
    ("RSS MiB", "peak_rss_mib", "{:,.0f}"),
    ("J/tok", "joules_per_token", "{:.4f}"),
)
KEY_COLUMNS = (("engine", "engine"), ("B", "batch_size"), ("P", "prompt_length"), ("N", "output_length"))


def table_cells(result: BenchResult) -> list[str]:
    """The table's cells for one configuration; a failed one shows its status and error instead of figures."""
    values = row(result)
    cells = [str(values[key]) for _, key in KEY_COLUMNS]
    if result.status != "ok":
        return cells + [f"{result.status.upper()}: {result.error}"]
    return cells + ["-" if values[key] is None else fmt.format(values[key]) for _, key, fmt in TABLE_COLUMNS]


STOPPED_TEXT = {"decided": "decided", "max runs": "reached the most runs", "budget": "the top-up's time was spent",
                "interrupted": "interrupted"}


def top_up_text(report: SweepReport, group: GroupVerdicts) -> str | None:
    """How many runs per length `group`'s verdicts used, and how its top-up went; None without top-up."""
    record = next((g for g in report.top_up_groups
                   if (g.engine, g.prompt_length, g.batch_size) == (group.engine, group.prompt_length, group.batch_size)),
                  None)
    if record is None:
        return None
    counts = sorted({len(r.runs) for r in report.results if r.status == "ok" and
                     (r.config.engine, r.prompt_length, r.config.batch_size) == (group.engine, group.prompt_length,
                                                                                 group.batch_size)})
    used = "no" if not counts else str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    if record.rounds == 0 and record.stopped == "decided":
        return f"{used} runs per length; decided without top-up"
    rounds = f"{record.rounds} top-up round{'' if record.rounds == 1 else 's'}"
    return f"{used} runs per length ({rounds}); top-up stopped: {STOPPED_TEXT[record.stopped]}"


def verdict_lines(report: SweepReport) -> list[str]:
    lines = []
    for group in report.verdicts:
        lines.append(f"hypotheses, {group.label}:")
        top_up = top_up_text(report, group)
        if top_up is not None:
            lines.append(f"  {top_up}")
        lines += [f"  {v.verdict.upper():<15} {v.name}: {v.explanation}" for v in group.verdicts]
    return lines


def runs_text(config: SweepConfig) -> str:
    """``1 warm-up + 3 runs each``, and ``, up to 10 where undecided`` when undecided groups are topped up."""
    text = f"{config.warmup_runs} warm-up + {config.runs} runs each"
    return f"{text}, up to {config.max_runs} where undecided" if config.tops_up else text


def status_line(report: SweepReport) -> str:
    total = len(report.config.bench_configs())
    done = len(report.results)
    failed = sum(r.status != "ok" for r in report.results)
    state = "complete" if report.complete else "INTERRUPTED"
    return (f"{title(report.fingerprint)} | {state}: {done} of {total} configurations, {failed} failed | "
            f"{runs_text(report.config)}, {report.config.order} | {report.config.sampling.describe()}")


def cost_notes(results: Sequence[BenchResult]) -> list[str]:
    """What the memory columns mean, and once, why energy was not measured (if it was not)."""
    lines = ["memory: GPU peak = peak allocated over a block of back-to-back requests after the timed runs; "
             "RSS = the process's peak resident memory so far"]
    missing = [r.energy.reason for r in results if r.energy is not None and not hasattr(r.energy, "joules")]
    if missing:
        lines.append(f"energy: {missing[0]}")
    return lines


def format_sweep_table(report: SweepReport) -> str:
    """One row per configuration, then the verdict of each hypothesis per group, then where the files are."""
    headers = [h for h, _ in KEY_COLUMNS] + [h for h, _, _ in TABLE_COLUMNS]
    rows = [table_cells(r) for r in report.results]
    full = [headers] + [cells for cells in rows if len(cells) == len(headers)]
    widths = [max(len(cells[i]) for cells in full) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [status_line(report), line(headers), "-" * len(line(headers))]
    # a failed row: its key cells, then its status and error as they are
    lines += [line(cells) if len(cells) == len(headers) else f"{line(cells[:4])}  {cells[4]}" for cells in rows]
    lines += verdict_lines(report)
    lines += cost_notes(report.results)
    if report.files:
        lines.append(f"files in {report.folder}: results/*.json, " + ", ".join(p.name for p in report.files))
    return "\n".join(lines)


def markdown_text(report: SweepReport) -> str:
    """sweep.md: the same table as Markdown, and the verdicts."""
    headers = [h for h, _ in KEY_COLUMNS] + [h for h, _, _ in TABLE_COLUMNS]
    lines = [f"# inferlab sweep: {title(report.fingerprint)}", "", status_line(report), "",
             "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for result in report.results:
        cells = table_cells(result)
        cells += [""] * (len(headers) - len(cells))
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines += ["", "## Hypotheses", ""]
    for group in report.verdicts:
        lines.append(f"### {group.label}")
        top_up = top_up_text(report, group)
        if top_up is not None:
            lines += [f"{top_up[0].upper()}{top_up[1:]}.", ""]
        lines += [f"- **{v.verdict}**: {v.name}. {v.explanation}" for v in group.verdicts]
        lines.append("")
    lines.append("Rules and formulas: `inferlab/suite/hypotheses.py`.")
    lines += ["", *cost_notes(report.results)]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- gate simulation


def format_simulation(simulation: dict) -> str:
    lines = ["| true slowdown | method | FAIL | INCONCLUSIVE | PASS |", "|---|---|---|---|---|"]
    for slowdown, methods in simulation["rates"].items():
        for method, r in methods.items():
            lines.append(f"| {slowdown} | {method} | {100 * r['FAIL']:.1f}% | {100 * r['INCONCLUSIVE']:.1f}% | "
                         f"{100 * r['PASS']:.1f}% |")
    return "\n".join(lines)
