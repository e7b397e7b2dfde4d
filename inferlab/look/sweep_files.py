"""The sweep's rendered files: sweep.csv, sweep.md, the four PNG plots and sweep.html, beside sweep.json."""

from __future__ import annotations

from dataclasses import replace

from inferlab.look import html_report, plots
from inferlab.look.tables import csv_text, markdown_text, title
from inferlab.storage import write_text_atomic
from inferlab.suite.sweep import SweepReport, write_json


def write_outputs(report: SweepReport) -> SweepReport:
    """sweep.json, sweep.csv, sweep.md, the plots and sweep.html, each new and written atomically;
    pass it to `run_sweep(..., write=write_outputs)`."""
    report = write_json(report)
    folder = report.folder
    files = [*report.files,
             write_text_atomic(folder / "sweep.csv", csv_text(report.results)),
             write_text_atomic(folder / "sweep.md", markdown_text(report))]
    files += plots.write_plots(report.results, folder, title(report.fingerprint))
    files.append(write_text_atomic(folder / "sweep.html", html_report.sweep_html(report, files)))
    return replace(report, files=tuple(files))
