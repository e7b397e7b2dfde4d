"""The HTML pages of a sweep and of a gate, read back with html.parser: every section there,
every image a real PNG carried inside the page, nothing fetched from anywhere."""

import base64
import json
import statistics
from html.parser import HTMLParser

import numpy as np

from inferlab.cli import main
from inferlab.look import html_report
from inferlab.measure.profiling import KernelTime, ProfileSummary
from inferlab.storage import new_run_folder
from inferlab.suite import progress, sweep
from inferlab.look.sweep_files import write_outputs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """Collects section ids, <img> sources, every src/href, and the tags used."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.sections, self.images, self.links, self.tags = [], [], [], set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "section":
            self.sections.append(attrs.get("id"))
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        self.links += [value for key, value in attrs.items() if key in ("src", "href") and value]


def decoded_pngs(page: Page) -> list[bytes]:
    prefix = "data:image/png;base64,"
    assert all(src.startswith(prefix) for src in page.images)
    return [base64.b64decode(src[len(prefix):], validate=True) for src in page.images]


def assert_self_contained(page: Page) -> None:
    assert not any(link.startswith(("http://", "https://", "//")) for link in page.links)
    assert not page.tags & {"script", "link", "iframe"}


def test_the_sweep_page_holds_every_section_and_embedded_plots(tiny, tmp_path):
    config = sweep.SweepConfig(model="tiny-random", output_lengths=(2, 4, 8), prompt_lengths=(4,), warmup_runs=0, runs=2)
    report = sweep.run_sweep(tiny, config, new_run_folder(tmp_path, "sweep"), (None, "unknown"),
                             progress.NullProgress(), write=write_outputs)
    path = report.folder / "sweep.html"
    assert path in report.files
    text = path.read_text()
    page = Page(text)
    assert page.sections == list(html_report.SWEEP_SECTIONS)
    pngs = decoded_pngs(page)
    assert len(pngs) == 4 and all(png.startswith(PNG_MAGIC) for png in pngs)
    assert pngs[0] == (report.folder / "ttft.png").read_bytes()
    assert_self_contained(page)
    assert text.count("<tr><td>eager</td>") == 2 * 3  # a latency row and a memory row per configuration
    assert "total latency grows linearly with output length" in text  # the hypotheses' verdicts
    assert "NVIDIA GPUs only" in text  # why energy is missing, said in the page


def test_a_profiled_sweep_page_lists_the_top_operators(tiny, tmp_path):
    config = sweep.SweepConfig(model="tiny-random", output_lengths=(8,), prompt_lengths=(4,), warmup_runs=0, runs=1)
    report = sweep.run_sweep(tiny, config, new_run_folder(tmp_path, "sweep"), (None, "unknown"),
                             progress.NullProgress(), write=write_outputs,
                             profile=True)
    page = Page((report.folder / "sweep.html").read_text())
    assert page.sections == list(html_report.SWEEP_SECTIONS) + ["profiles"]


MACHINE = {"device_type": "cpu", "device_name": "Test CPU", "device_count": 1, "driver": None, "cuda": None,
           "torch": "2.x", "transformers": "5.x", "model": "each test's own", "dtype": "fp32", "layout": "single"}


def run_file(path, factor: float, seed: int) -> str:
    """A pytest-benchmark run: one TPOT entry, 20 raw rounds around factor x 1.3 ms."""
    data = list(factor * 1.3e-3 * np.exp(np.random.default_rng(seed).normal(0.0, 0.01, 20)))
    stats = {"min": min(data), "max": max(data), "mean": statistics.mean(data), "median": statistics.median(data),
             "rounds": 20, "iterations": 1, "data": data}
    entry = {"group": None, "name": "test_decode[eager-tpot_ms]", "fullname": "t.py::test_decode[eager-tpot_ms]",
             "params": {}, "param": "eager-tpot_ms", "options": {},
             "extra_info": {"metric": "tpot_ms", "fingerprint": {"model": "m", "dtype": "fp32", "engine": "eager"}},
             "stats": stats}
    path.write_text(json.dumps({"machine_info": {"node": "t", "inferlab": MACHINE}, "commit_info": {},
                                "benchmarks": [entry], "datetime": "2026-01-01T00:00:00", "version": "5.3.1"}))
    return str(path)


def profile_file(path, rows) -> str:
    summary = ProfileSummary("cuda", "kernels", 3, "decode steps 3-5", tuple(KernelTime(n, us, 1.0) for n, us in rows), "t")
    path.write_text(json.dumps({"schema": "inferlab.bench/1", "profile": summary.to_dict()}))
    return str(path)


def test_a_failing_gate_prints_the_kernel_diff_and_writes_its_page(tmp_path, capsys):
    base, head = run_file(tmp_path / "base.json", 1.0, 1), run_file(tmp_path / "head.json", 1.2, 2)
    profiles = [profile_file(tmp_path / "pb.json", [("gemv", 100.0), ("norm", 20.0)]),
                profile_file(tmp_path / "ph.json", [("gemv", 150.0), ("norm", 20.0)])]
    code = main(["gate", base, head, "--profiles", *profiles, "--json", str(tmp_path / "gate.json")])
    out = capsys.readouterr().out
    assert code == 1 and "gate: FAIL" in out
    assert "profile diff: kernels whose time per step grew most" in out and "+50.0  gemv" in out
    text = (tmp_path / "gate.html").read_text()
    page = Page(text)
    assert page.sections == list(html_report.GATE_SECTIONS) + ["profile-diff"]
    assert_self_contained(page)
    saved = json.loads((tmp_path / "gate.json").read_text())["rows"][0]
    assert f"{saved['ci_low']:.4f}" in text and f"{saved['ci_high']:.4f}" in text  # the interval, on the page
    assert '<td class="FAIL">FAIL</td>' in text


def test_a_passing_gate_prints_no_diff_and_its_page_has_no_diff_section(tmp_path, capsys):
    base, head = run_file(tmp_path / "base.json", 1.0, 1), run_file(tmp_path / "head.json", 1.0, 1)
    profiles = [profile_file(tmp_path / "pb.json", [("gemv", 100.0)]), profile_file(tmp_path / "ph.json", [("gemv", 150.0)])]
    assert main(["gate", base, head, "--profiles", *profiles, "--json", str(tmp_path / "gate.json")]) == 0
    assert "profile diff" not in capsys.readouterr().out
    assert Page((tmp_path / "gate.html").read_text()).sections == list(html_report.GATE_SECTIONS)


def test_an_existing_gate_page_is_kept_and_nothing_is_written(tmp_path, capsys):
    base = run_file(tmp_path / "base.json", 1.0, 1)
    (tmp_path / "gate.html").write_text("earlier")
    assert main(["gate", base, base, "--json", str(tmp_path / "gate.json")]) == 2
    assert "gate.html exists and is kept" in capsys.readouterr().err
    assert not (tmp_path / "gate.json").exists() and (tmp_path / "gate.html").read_text() == "earlier"
