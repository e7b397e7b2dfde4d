"""Text tables for benchmark results (the CLI prints them; nothing here prints)."""

from __future__ import annotations

from inferlab.measure.bench import BenchResult

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
    return "\n".join(lines)


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
