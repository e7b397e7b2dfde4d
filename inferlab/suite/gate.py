"""The merge gate: PASS, FAIL or INCONCLUSIVE for head against base pytest-benchmark runs.

Input: runs saved by ``pytest ... --benchmark-autosave --benchmark-save-data`` (or
``--benchmark-json``), one or more per side. Each benchmark entry is one metric series
(``extra_info["metric"]``: ttft_ms, tpot_ms or e2e_ms; "time" for a plain pytest-benchmark
test) whose ``stats["data"]`` holds the raw round times in seconds.

Why runs, not rounds, are the unit. A benchmark's rounds run back to back in one pytest
process and share its clock frequency, core placement, allocator layout, thermal state and the
neighbours' load at that time, so they shift together: the spread of rounds inside a run
understates how much a second run would differ (on a shared 2-vCPU VM: rounds' interquartile
range about -5% / +8% of the median, run medians' std of log 15-30%; docs/perf/gate-cpu.md).
Treating rounds as independent samples makes an A/A comparison of two runs "significant" far
too often. So each run contributes one number, the median of its rounds, and the spread
between runs is modelled explicitly.

Estimate, per benchmark, with m_r the median of run r's raw rounds:

    log ratio = mean_r log m_r(head) - mean_r log m_r(base),   ratio = exp(log ratio)

ratio > 1 means head is slower. With one run per side it is head median / base median.

Interval: a hierarchical bootstrap. Each replicate, for each side of n runs: draw n runs with
replacement, draw each drawn run's rounds with replacement, take medians, average their logs,
and add a Normal(0, run_noise / sqrt(n)) term: the run-to-run spread of a run's median, which
no single run can show (with one run per side, resampling rounds only sees the within-run
noise). ``run_noise`` is a fraction (0.01 = 1%, the default); calibrate it with
`estimate_run_noise` on repeated runs of the same code (std of log medians across runs; it
also contains the within-run noise of the median, so it over-estimates slightly: conservative).
With several runs per side, resampling the runs already sees their spread, and run_noise may be
set lower (0 is defensible from about five runs per side). The interval is the percentile
interval of head - base over the replicates, exponentiated.

Multiple testing: with k benchmarks compared and family-wise confidence c, each benchmark's
two-sided interval has level 1 - (1 - c) / k (Bonferroni), so that with probability >= c no
interval misses its true ratio. Replicates: at least 4000, and enough that each tail beyond
the interval holds >= 20 replicates: max(4000, ceil(20 / ((1 - c) / 2k))).

Verdict, per benchmark, with interval [low, high] and threshold t for its metric:

    PASS          high < 1 + t                 the slowdown, if any, is below t
    FAIL          high >= 1 + t and low > 1    significantly slower, and t is not ruled out
    INCONCLUSIVE  high >= 1 + t and low <= 1   the data cannot tell 0 from t

Why this rule and not "FAIL if low > 1 and ratio >= 1 + t" (the point-estimate rule). Both PASS
only when high < 1 + t, and both need low > 1 to FAIL, so with no real change both FAIL with
probability <= (1 - c) / 2k per benchmark, <= (1 - c) / 2 per suite. They differ on a slowdown
of about t: the point-estimate rule FAILs it only when the estimate lands above 1 + t, about half
the time however much data there is, and calls the rest INCONCLUSIVE, which more runs never
resolve. This rule FAILs it unless the interval still holds 1: here INCONCLUSIVE means exactly
"the interval holds both 1 and 1 + t", which more runs always resolve. The price: a real
slowdown within the interval's half-width below t can FAIL too (it is significant, and the data
cannot show it is smaller than t). A FAIL's interval lies above 1 and reaches 1 + t, so its
estimate is roughly t / 2 or more. Simulated on a quiet machine (run_noise 0.5%, 20 rounds with
1% noise, t = 5%), a true 5% slowdown FAILed 99.4% of the time against 50.6% with the
point-estimate rule, and a true 2.5% one 31% against 0.1% (docs/perf/gate-cpu.md).

Suite: FAIL if any benchmark FAILs, else INCONCLUSIVE if any is, else PASS; exit codes 1, 3, 0.

For comparison, `pytest_benchmark_style` decides what ``--benchmark-compare-fail=median:X%``
would: fail when head median > base median x (1 + X), one run per side, no interval.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from inferlab.errors import UsageError
from inferlab.storage import write_json_atomic

SCHEMA = "inferlab.gate/1"
PASS, FAIL, INCONCLUSIVE = "PASS", "FAIL", "INCONCLUSIVE"
EXIT_CODES = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}
DEFAULT_THRESHOLD = 0.05
DEFAULT_RUN_NOISE = 0.01
MIN_REPLICATES = 4000
TAIL_REPLICATES = 20
# machine_info["inferlab"] keys that must agree (the plugin's COMPARED_KEYS), and the
# per-benchmark fingerprint keys that must agree.
MACHINE_KEYS = ("device_name", "device_count", "model", "dtype", "layout")
FINGERPRINT_KEYS = ("model", "dtype", "engine", "layout")
SAVE_HINT = "pass a run saved by pytest with --benchmark-autosave --benchmark-save-data (or --benchmark-json)"
SHOWN_NAMES = 3


@dataclass(frozen=True)
class Series:
    """One benchmark entry of one run: its raw round times in seconds, as saved."""

    fullname: str
    name: str
    metric: str
    rounds_s: tuple[float, ...]
    fingerprint: Mapping[str, object]  # the FINGERPRINT_KEYS of extra_info["fingerprint"], when saved

    @property
    def rounds_ms(self) -> tuple[float, ...]:
        return tuple(1e3 * r for r in self.rounds_s)

    @property
    def median_ms(self) -> float:
        return 1e3 * float(np.median(self.rounds_s))


@dataclass(frozen=True)
class Run:
    """One saved pytest-benchmark run: where it came from, its machine, its benchmark entries."""

    path: Path
    machine: Mapping[str, object]  # machine_info["inferlab"], or empty for a plain run
    series: tuple[Series, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.fullname for s in self.series)

    def get(self, fullname: str) -> Series:
        return next(s for s in self.series if s.fullname == fullname)


# ----------------------------------------------------------------------------- loading


def load_run(path: Path) -> Run:
    """Read one pytest-benchmark JSON file (never written to); UsageError naming the fix if it is unusable."""
    path = Path(path)
    return _parse_run(path, _read_json(path))


def _read_json(path: Path) -> object:
    if path.is_dir():
        raise UsageError(f"{path} is a folder: pass one run's JSON file, e.g. .benchmarks/<machine>/0001_*.json")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file: {SAVE_HINT}") from None
    except OSError as error:
        raise UsageError(f"cannot read {path} ({error.strerror}): check the path and its permissions") from None
    if not raw.strip():
        raise UsageError(f"{path} is empty (an interrupted run?): re-run the benchmarks with --benchmark-save-data")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        where = f" (line {error.lineno}: {error.msg})" if isinstance(error, json.JSONDecodeError) else ""
        raise UsageError(f"{path} is not valid JSON{where}: {SAVE_HINT}") from None


def _parse_run(path: Path, data: object) -> Run:
    entries = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not isinstance(data.get("machine_info"), dict):
        raise UsageError(f"{path} is not a pytest-benchmark run (no 'machine_info' and 'benchmarks'): {SAVE_HINT}")
    if not entries:
        raise UsageError(f"{path} holds no benchmarks (all skipped or deselected?): re-run with the perf tests selected")
    series = tuple(_parse_series(path, entry) for entry in entries)
    names = [s.fullname for s in series]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"{path} holds benchmark {twice[0]} more than once: pass a run of one pytest session")
    machine = data["machine_info"].get("inferlab") or {}
    return Run(path, MappingProxyType(dict(machine)), series)


def _parse_series(path: Path, entry: object) -> Series:
    if not isinstance(entry, dict) or not isinstance(entry.get("fullname"), str) or not isinstance(entry.get("stats"), dict):
        raise UsageError(f"{path} is not a pytest-benchmark run (a benchmark without fullname or stats): {SAVE_HINT}")
    name = entry["fullname"]
    data = entry["stats"].get("data")
    if not data:
        raise UsageError(f"{path}: {name} was saved without raw data: re-run with --benchmark-save-data")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in data):
        raise UsageError(f"{path}: {name} has round times that are not positive numbers: check that the test measures something")
    extra = entry.get("extra_info") if isinstance(entry.get("extra_info"), dict) else {}
    fingerprint = extra.get("fingerprint") if isinstance(extra.get("fingerprint"), dict) else {}
    return Series(
        fullname=name,
        name=str(entry.get("name") or name),
        metric=str(extra.get("metric") or "time"),
        rounds_s=tuple(float(x) for x in data),
        fingerprint=MappingProxyType({k: fingerprint[k] for k in FINGERPRINT_KEYS if k in fingerprint}),
    )


# ----------------------------------------------------------------------------- comparability


def check_comparable(base_runs: Sequence[Run], head_runs: Sequence[Run]) -> None:
    """UsageError unless every run holds the same benchmarks, made on the same machine, model, dtype and engine."""
    if not base_runs or not head_runs:
        raise UsageError("gate needs at least one base and one head run: inferlab gate BASE.json HEAD.json")
    reference = base_runs[0]
    for run in list(base_runs[1:]) + list(head_runs):
        _check_same_benchmarks(reference, run)
        _check_same_machine(reference, run)
        _check_same_fingerprints(reference, run)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown + (f" and {len(names) - SHOWN_NAMES} more" if len(names) > SHOWN_NAMES else "")


def _check_same_benchmarks(reference: Run, run: Run) -> None:
    only_reference = [n for n in reference.names if n not in set(run.names)]
    only_run = [n for n in run.names if n not in set(reference.names)]
    if only_reference or only_run:
        parts = [f"{len(names)} only in {path} ({_names(names)})"
                 for names, path in ((only_reference, reference.path), (only_run, run.path)) if names]
        raise UsageError(f"benchmarks differ: {'; '.join(parts)}: run the same tests with the same options on both sides")


def _check_same_machine(reference: Run, run: Run) -> None:
    for key in MACHINE_KEYS:
        if reference.machine.get(key) != run.machine.get(key):
            raise UsageError(
                f"{reference.path} and {run.path} differ in {key} ({reference.machine.get(key)!r} vs {run.machine.get(key)!r}): "
                "compare runs made on the same device with the same model, dtype and layout"
            )


def _check_same_fingerprints(reference: Run, run: Run) -> None:
    for series in reference.series:
        other = run.get(series.fullname)
        for key in FINGERPRINT_KEYS + ("metric",):
            ours = series.metric if key == "metric" else series.fingerprint.get(key)
            theirs = other.metric if key == "metric" else other.fingerprint.get(key)
            if ours != theirs:
                raise UsageError(
                    f"{series.fullname}: {key} is {ours!r} in {reference.path} but {theirs!r} in {run.path}: "
                    "compare runs of the same model, dtype, engine and layout"
                )


# ----------------------------------------------------------------------------- thresholds

_PERCENT = re.compile(r"^([+-]?\d+(?:\.\d*)?|[+-]?\.\d+)\s*%$")
_METRIC = re.compile(r"^[A-Za-z_][\w.-]*$")
THRESHOLD_EXAMPLE = "write e.g. 5% or tpot_ms=3%,default=5%"


def parse_thresholds(text: str) -> dict[str, float]:
    """'5%' -> {'default': 0.05}; 'tpot_ms=3%,default=5%' -> per metric. A missing default is 5%."""
    parts = [part.strip() for part in str(text).split(",")]
    if not any(parts) or not all(parts):
        raise UsageError(f"--threshold {text!r} has an empty entry: {THRESHOLD_EXAMPLE}")
    thresholds: dict[str, float] = {}
    for part in parts:
        metric, _, value = part.rpartition("=")
        metric = metric.strip() or "default"
        if not _METRIC.match(metric):
            raise UsageError(f"--threshold {text!r}: {metric!r} is not a metric name: {THRESHOLD_EXAMPLE}")
        if metric in thresholds:
            raise UsageError(f"--threshold {text!r} sets {metric} twice: give each metric one threshold")
        thresholds[metric] = _fraction(value.strip(), text)
    thresholds.setdefault("default", DEFAULT_THRESHOLD)
    return thresholds


def _fraction(value: str, text: str) -> float:
    match = _PERCENT.match(value)
    if not match:
        raise UsageError(f"--threshold {text!r}: {value!r} is not a percentage: {THRESHOLD_EXAMPLE}")
    fraction = float(match.group(1)) / 100
    if not 0 <= fraction < 1:
        raise UsageError(f"--threshold {text!r}: {value} is outside [0%, 100%): give the slowdown that counts, e.g. 5%")
    return fraction


def threshold_for(metric: str, thresholds: Mapping[str, float]) -> float:
    """The metric's own threshold, else the default one."""
    return thresholds.get(metric, thresholds.get("default", DEFAULT_THRESHOLD))


# ----------------------------------------------------------------------------- statistics


def log_median(rounds: Sequence[float]) -> float:
    """log(median(rounds)) of one run."""
    return float(np.log(np.median(rounds)))


def log_ratio(base: Sequence[Sequence[float]], head: Sequence[Sequence[float]]) -> float:
    """mean_r log m_r(head) - mean_r log m_r(base), m_r = median of run r's rounds."""
    return float(np.mean([log_median(r) for r in head]) - np.mean([log_median(r) for r in base]))


def resampled_mean_log_median(
    runs: Sequence[Sequence[float]], replicates: int, run_noise: float, rng: np.random.Generator
) -> np.ndarray:
    """[replicates] draws of mean_r log m_r: runs, then each run's rounds, drawn with replacement, + N(0, run_noise/sqrt(n))."""
    n = len(runs)
    picked = rng.integers(n, size=(replicates, n))  # which run fills each of the n slots
    logs = np.empty((replicates, n))
    for index, rounds in enumerate(runs):
        rounds = np.asarray(rounds, dtype=float)
        slots = picked == index
        draws = rounds[rng.integers(len(rounds), size=(int(slots.sum()), len(rounds)))]
        logs[slots] = np.log(np.median(draws, axis=1))
    return logs.mean(axis=1) + rng.normal(0.0, run_noise / math.sqrt(n), size=replicates)


def bootstrap_log_ratios(
    base: Sequence[Sequence[float]], head: Sequence[Sequence[float]], replicates: int, run_noise: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """[replicates] hierarchical-bootstrap draws of the log ratio head / base."""
    base_draws = resampled_mean_log_median(base, replicates, run_noise, rng)
    return resampled_mean_log_median(head, replicates, run_noise, rng) - base_draws


def bonferroni_level(confidence: float, k: int) -> float:
    """Per-benchmark two-sided level 1 - (1 - confidence) / k."""
    return 1 - (1 - confidence) / k


def replicates_for(level: float) -> int:
    """max(4000, ceil(20 / tail)), tail = (1 - level) / 2: each tail keeps >= 20 replicates."""
    return max(MIN_REPLICATES, math.ceil(TAIL_REPLICATES / ((1 - level) / 2) - 1e-9))


def percentile_interval(log_ratios: np.ndarray, level: float) -> tuple[float, float]:
    """exp of the (1-level)/2 and (1+level)/2 quantiles: the interval of the ratio."""
    low, high = np.quantile(log_ratios, [(1 - level) / 2, (1 + level) / 2])
    return math.exp(low), math.exp(high)


def verdict(ci_low: float, ci_high: float, threshold: float) -> str:
    """PASS if high < 1 + t; FAIL if low > 1 (and high >= 1 + t); else INCONCLUSIVE."""
    if ci_high < 1 + threshold:
        return PASS
    if ci_low > 1:
        return FAIL
    return INCONCLUSIVE


def suite_verdict(verdicts: Sequence[str]) -> str:
    """FAIL if any FAIL, else INCONCLUSIVE if any, else PASS."""
    if FAIL in verdicts:
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS


def estimate_run_noise(runs: Sequence[Run]) -> dict[str, float]:
    """Per benchmark, the std (ddof=1) of log m_r across >= 2 runs of the same code: a value for run_noise.

    It includes the within-run noise of each median as well as the run-to-run shift, so it is an
    upper estimate; with several benchmarks take the largest (or that of the metric you gate).
    """
    if len(runs) < 2:
        raise UsageError(f"estimating run noise needs at least 2 runs of the same code, got {len(runs)}: repeat the run")
    check_comparable(runs[:1], runs[1:])
    return {name: float(np.std([log_median(run.get(name).rounds_s) for run in runs], ddof=1)) for name in runs[0].names}


def pytest_benchmark_style(base_run: Run, head_run: Run, threshold: float) -> dict[str, bool]:
    """fullname -> True where --benchmark-compare-fail=median:X% fails: head median > base median x (1 + X)."""
    check_comparable([base_run], [head_run])
    return {
        name: float(np.median(head_run.get(name).rounds_s)) > float(np.median(base_run.get(name).rounds_s)) * (1 + threshold)
        for name in base_run.names
    }


# ----------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class Row:
    """One benchmark's comparison: the raw rounds (ms) of every run on each side, and what follows."""

    fullname: str
    name: str
    metric: str
    base_rounds_ms: tuple[tuple[float, ...], ...]
    head_rounds_ms: tuple[tuple[float, ...], ...]
    ratio: float
    ci_low: float
    ci_high: float
    threshold: float
    verdict: str

    @property
    def base_median_ms(self) -> float:
        """exp(mean_r log m_r) over base runs: the median itself with one run."""
        return math.exp(np.mean([log_median(r) for r in self.base_rounds_ms]))

    @property
    def head_median_ms(self) -> float:
        return math.exp(np.mean([log_median(r) for r in self.head_rounds_ms]))


@dataclass(frozen=True)
class Report:
    """Every row and the settings that produced them."""

    rows: tuple[Row, ...]
    confidence: float
    run_noise: float
    level: float  # per benchmark, after Bonferroni
    replicates: int
    seed: int
    thresholds: Mapping[str, float]
    base_paths: tuple[str, ...]
    head_paths: tuple[str, ...]

    @property
    def k(self) -> int:
        return len(self.rows)

    @property
    def verdict(self) -> str:
        return suite_verdict([row.verdict for row in self.rows])

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def counts(self) -> dict[str, int]:
        return {v: sum(row.verdict == v for row in self.rows) for v in (FAIL, INCONCLUSIVE, PASS)}


def compare(
    base_runs: Sequence[Run], head_runs: Sequence[Run], thresholds: Mapping[str, float] | None = None,
    confidence: float = 0.95, run_noise: float = DEFAULT_RUN_NOISE, seed: int = 0,
) -> Report:
    """Ratio, Bonferroni interval and verdict for every benchmark (see the module docstring)."""
    thresholds = dict(thresholds or {"default": DEFAULT_THRESHOLD})
    _check_settings(confidence, run_noise)
    check_comparable(base_runs, head_runs)
    names = base_runs[0].names
    _check_threshold_metrics(thresholds, {base_runs[0].get(n).metric for n in names})
    level = bonferroni_level(confidence, len(names))
    replicates = replicates_for(level)
    rows = tuple(
        _row(name, base_runs, head_runs, thresholds, level, replicates, run_noise, seed) for name in names
    )
    return Report(rows, confidence, run_noise, level, replicates, seed, MappingProxyType(thresholds),
                  tuple(str(r.path) for r in base_runs), tuple(str(r.path) for r in head_runs))


def _check_settings(confidence: float, run_noise: float) -> None:
    if not 0 < confidence < 1:
        raise UsageError(f"confidence must be between 0 and 1, got {confidence}: use e.g. 0.95")
    if not (run_noise >= 0 and math.isfinite(run_noise)):
        raise UsageError(f"run noise must be a fraction >= 0, got {run_noise}: use e.g. 0.01 for 1%")


def _check_threshold_metrics(thresholds: Mapping[str, float], metrics: set[str]) -> None:
    unknown = sorted(m for m in thresholds if m != "default" and m not in metrics)
    if unknown:
        raise UsageError(f"--threshold names {', '.join(unknown)}, which no benchmark measures "
                         f"(these measure {', '.join(sorted(metrics))}): fix the metric name")


def _row(name: str, base_runs: Sequence[Run], head_runs: Sequence[Run], thresholds: Mapping[str, float],
         level: float, replicates: int, run_noise: float, seed: int) -> Row:
    series = base_runs[0].get(name)
    base = [run.get(name).rounds_ms for run in base_runs]
    head = [run.get(name).rounds_ms for run in head_runs]
    # Seeded by the name too: a benchmark's interval does not depend on which others are compared.
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    low, high = percentile_interval(bootstrap_log_ratios(base, head, replicates, run_noise, rng), level)
    threshold = threshold_for(series.metric, thresholds)
    return Row(name, series.name, series.metric, tuple(base), tuple(head), math.exp(log_ratio(base, head)),
               low, high, threshold, verdict(low, high, threshold))


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
