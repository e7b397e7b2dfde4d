"""One self-contained HTML page per sweep and per gate: nothing on it is fetched from the network.

A sweep's page holds the card (what was measured, where, whether it finished), the versions,
the latency table, memory and energy, the hypotheses' verdicts, the plots (PNG, embedded as
base64 data URIs) and, when profiled, the top kernels. A gate's page holds its card, the
versions, every benchmark's verdict with its interval, and the kernel diff when there is one.
Every section is a ``<section id="...">``; styles are inline; there are no scripts.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from inferlab.look import tables
from inferlab.suite.gate.verdict import FAIL, INCONCLUSIVE, PASS

if TYPE_CHECKING:
    from inferlab.look.profile_diff import KernelChange
    from inferlab.suite.gate.judge import Judgement
    from inferlab.suite.gate.verdict import Report
    from inferlab.suite.sweep import SweepReport

SWEEP_SECTIONS = ("card", "versions", "latency", "memory-energy", "hypotheses", "plots")
GATE_SECTIONS = ("card", "versions", "verdicts", "tails-budgets")
VERSION_KEYS = ("device_name", "device_count", "driver", "cuda", "torch", "transformers", "python", "platform")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 80em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.card { border: 1px solid #bbb; border-radius: 6px; padding: 0.5em 1em; background: #fafafa; }
.PASS, .holds { color: #17692b; font-weight: bold; } .FAIL, .does-not-hold { color: #a11; font-weight: bold; }
.INCONCLUSIVE, .not-enough-data { color: #8a6d00; font-weight: bold; }
img { max-width: 48%; margin: 0.5%; border: 1px solid #ddd; }
"""


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return escape(str(value))


def html_table(headers: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A table; cells are escaped, floats shown to 4 significant digits."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def section(key: str, title: str, body: str) -> str:
    return f'<section id="{escape(key)}"><h2>{escape(title)}</h2>{body}</section>'


def png_image(name: str, data: bytes) -> str:
    """An <img> carrying the PNG itself."""
    encoded = base64.b64encode(data).decode("ascii")
    return f'<img alt="{escape(name)}" title="{escape(name)}" src="data:image/png;base64,{encoded}">'


def page(title: str, sections: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{escape(title)}</h1>{''.join(sections)}</body></html>\n")


def _key_values(pairs: Iterable[tuple[str, object]]) -> str:
    return html_table(("", ""), ((k, v) for k, v in pairs))


def versions_section(fingerprint: Mapping) -> str:
    return section("versions", "Versions", _key_values((k, fingerprint.get(k)) for k in VERSION_KEYS if k in fingerprint))


# ----------------------------------------------------------------------------- sweep


def _sweep_card(report: SweepReport) -> str:
    config, fp = report.config, report.fingerprint
    pairs = [
        ("model", f"{fp.get('model')} ({fp.get('model_source', '')})"), ("dtype", fp.get("dtype")),
        ("device", fp.get("device_name")), ("layout", fp.get("layout")), ("engines", ", ".join(config.engines)),
        ("batch sizes", ", ".join(map(str, config.batch_sizes))),
        ("prompt lengths", ", ".join(map(str, config.prompt_lengths))),
        ("output lengths", ", ".join(map(str, config.output_lengths))),
        ("runs", f"{config.warmup_runs} warm-up + {config.runs} measured per configuration"
                 + (f", up to {config.max_runs} where undecided ({config.top_up_s:g} s for the top-up)"
                    if config.tops_up else "")),
        ("sampling", config.sampling.describe()), ("folder", report.folder.name),
    ]
    return section("card", "Card", f'<div class="card"><p>{escape(tables.status_line(report))}</p>{_key_values(pairs)}</div>')


def _latency_section(report: SweepReport) -> str:
    headers = [h for h, _ in tables.KEY_COLUMNS] + [h for h, _, _ in tables.TABLE_COLUMNS]
    rows = []
    for result in report.results:
        cells = tables.table_cells(result)
        rows.append(cells + [""] * (len(headers) - len(cells)))
    return section("latency", "Latency (p50 over runs unless named)", html_table(headers, rows))


MEMORY_HEADERS = ("engine", "B", "P", "N", "GPU peak allocated MiB", "GPU peak reserved MiB", "weights MiB",
                  "KV cache at final length MiB", "process peak RSS MiB", "J/token", "mean W", "energy +-%")


def _memory_section(report: SweepReport) -> str:
    rows = []
    for result in report.results:
        values = tables.row(result)
        reading = result.energy
        spread = getattr(reading, "relative_uncertainty", None)
        rows.append([values["engine"], values["batch_size"], values["prompt_length"], values["output_length"],
                     values["peak_allocated_mib"], values["peak_reserved_mib"], values["weight_mib"],
                     values["kv_cache_mib"], values["peak_rss_mib"], values["joules_per_token"], values["mean_watts"],
                     None if spread is None else 100 * spread])
    notes = "".join(f"<p>{escape(line)}</p>" for line in tables.cost_notes(report.results))
    return section("memory-energy", "Memory and energy", html_table(MEMORY_HEADERS, rows) + notes)


def _hypotheses_section(report: SweepReport) -> str:
    parts = []
    for group in report.verdicts:
        items = "".join(
            f'<li><span class="{escape(v.verdict.replace(" ", "-"))}">{escape(v.verdict)}</span>: '
            f"{escape(v.name)}. {escape(v.explanation)}</li>" for v in group.verdicts)
        top_up = tables.top_up_text(report, group)
        note = "" if top_up is None else f"<p>{escape(top_up)}</p>"
        parts.append(f"<h3>{escape(group.label)}</h3>{note}<ul>{items}</ul>")
    return section("hypotheses", "Hypotheses", "".join(parts) or "<p>no groups measured</p>")


def _plots_section(images: Sequence[tuple[str, bytes]]) -> str:
    return section("plots", "Plots (p50, bars p5-p95)", "".join(png_image(n, d) for n, d in images) or "<p>none</p>")


def _profiles_section(report: SweepReport) -> str | None:
    profiled = [r for r in report.results if r.profile is not None]
    if not profiled:
        return None
    parts = []
    for result in profiled:
        summary = result.profile
        parts.append(f"<h3>{escape(_label(result))}: {escape(summary.window)}, "
                     f"trace {escape(summary.trace)}</h3>")
        parts.append(html_table(("name", "us/step", "calls/step"),
                                ((r.name, r.us_per_step, r.calls_per_step) for r in summary.rows[:10])))
    return section("profiles", "Profiles: top kernels (GPU) or operators (CPU) per step", "".join(parts))


def _label(result) -> str:
    config = result.config
    return f"{config.engine} B={config.batch_size} P={result.prompt_length} N={config.output_length}"


def sweep_html(report: SweepReport, files: Sequence[Path] = ()) -> str:
    """The sweep's page; `files` are those written so far, of which the PNGs are embedded."""
    images = [(Path(p).name, Path(p).read_bytes()) for p in files if str(p).endswith(".png")]
    sections = [_sweep_card(report), versions_section(report.fingerprint), _latency_section(report),
                _memory_section(report), _hypotheses_section(report), _plots_section(images)]
    profiles = _profiles_section(report)
    if profiles:
        sections.append(profiles)
    return page(f"inferlab sweep: {tables.title(report.fingerprint)}", sections)


# ----------------------------------------------------------------------------- gate


def _gate_card(judgement: Judgement) -> str:
    report = judgement.medians
    counts = {v: judgement.verdicts.count(v) for v in (FAIL, INCONCLUSIVE, PASS)}
    pairs = [
        ("verdict", judgement.verdict), ("counts", ", ".join(f"{counts[k]} {k}" for k in counts)),
        ("benchmarks (k)", report.k), ("family-wise confidence", report.confidence),
        ("per-benchmark interval level", report.level), ("run noise", report.run_noise),
        ("bootstrap replicates", report.replicates),
        ("thresholds", ", ".join(f"{k}={100 * v:.3g}%" for k, v in report.thresholds.items())),
        ("base runs", ", ".join(Path(p).name for p in report.base_paths)),
        ("head runs", ", ".join(Path(p).name for p in report.head_paths)),
    ]
    verdict = f'<p>gate: <span class="{escape(judgement.verdict)}">{escape(judgement.verdict)}</span></p>'
    return section("card", "Card", f'<div class="card">{verdict}{_key_values(pairs)}</div>')


def _verdicts_section(report: Report) -> str:
    headers = ("benchmark", "metric", "base ms", "head ms", "ratio", f"CI {100 * report.level:.2f}% low",
               "CI high", "threshold", "verdict")
    body = []
    for row in report.rows:
        cells = [row.name, row.metric, f"{row.base_median_ms:.3f}", f"{row.head_median_ms:.3f}", f"{row.ratio:.4f}",
                 f"{row.ci_low:.4f}", f"{row.ci_high:.4f}", f"{100 * row.threshold:.3g}%"]
        body.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells)
                    + f'<td class="{escape(row.verdict)}">{escape(row.verdict)}</td></tr>')
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    rule = ("<p>ratio = head / base (&gt; 1: slower). PASS: interval below 1 + threshold; FAIL: interval above 1 "
            "and reaching 1 + threshold; otherwise INCONCLUSIVE.</p>")
    return section("verdicts", "Verdicts with their intervals",
                   f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{rule}")


def _diff_section(changes: Sequence[KernelChange]) -> str:
    rows = [(c.name, c.base_us, c.head_us, c.delta_us) for c in changes]
    table = html_table(("kernel", "base us/step", "head us/step", "+us/step"), rows) if rows else "<p>no kernel grew</p>"
    return section("profile-diff", "Kernels whose time per step grew most", table)


def _verdict_cell(verdict: str) -> str:
    return f'<td class="{escape(verdict)}">{escape(verdict)}</td>'


def _rows_table(headers: Sequence[str], rows: Iterable[tuple[Sequence[str], str]]) -> str:
    """A table whose last column is a verdict, coloured by its class."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + _verdict_cell(v) + "</tr>" for cells, v in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _tails_budgets_section(judgement: Judgement) -> str:
    """Tail, drift and budget verdicts: the rows beside the medians, in the same Bonferroni family."""
    parts = []
    if judgement.tails:
        rows = [((r.name, f"{r.metric} {r.stat}", f"{r.base_ms:.3f}", f"{r.head_ms:.3f}", f"{r.ratio:.4f}",
                  f"{r.ci_low:.4f}", f"{r.ci_high:.4f}", f"{100 * r.threshold:.3g}%"), r.verdict) for r in judgement.tails]
        parts.append("<h3>Tails</h3>" + _rows_table(("benchmark", "statistic", "base ms", "head ms", "ratio", "CI low",
                                                     "CI high", "threshold", "verdict"), rows))
    if judgement.drift:
        rows = [((r.name, r.metric, f"{r.ratio:.4f}", f"{r.ci_low:.4f}", f"{r.ci_high:.4f}",
                  f"{100 * r.threshold:.3g}%"), r.verdict) for r in judgement.drift]
        parts.append("<h3>Drift against the reference</h3>" + _rows_table(
            ("benchmark", "metric", "head / reference", "CI low", "CI high", "budget", "verdict"), rows))
    if judgement.budgets:
        rows = [((r.name, str(r.budget), f"{r.value_ms:.3f}", f"{r.ci_low_ms:.3f}", f"{r.ci_high_ms:.3f}",
                  f"{r.limit_ms:.3f}"), r.verdict) for r in judgement.budgets]
        parts.append("<h3>Budgets (head runs)</h3>" + _rows_table(
            ("benchmark", "budget", "value ms", "CI low ms", "CI high ms", "limit ms", "verdict"), rows))
    return section("tails-budgets", "Tails, drift and budgets", "".join(parts) or "<p>none judged</p>")


def gate_html(judgement: Judgement, machine: Mapping | None = None, changes: Sequence[KernelChange] | None = None) -> str:
    """The gate's page; `machine` is the base run's machine info, `changes` the kernel diff if profiled."""
    sections = [_gate_card(judgement), versions_section(machine or {}), _verdicts_section(judgement.medians),
                _tails_budgets_section(judgement)]
    if changes is not None:
        sections.append(_diff_section(changes))
    return page(f"inferlab gate: {judgement.verdict}", sections)
