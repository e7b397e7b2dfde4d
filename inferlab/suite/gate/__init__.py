"""The merge gate: PASS, FAIL or INCONCLUSIVE for head against base pytest-benchmark runs.

Input: runs saved by ``pytest ... --benchmark-autosave --benchmark-save-data`` (or
``--benchmark-json``), one or more per side. Each benchmark entry is one metric series
(``extra_info["metric"]``: ttft_ms, tpot_ms or e2e_ms; "time" for a plain pytest-benchmark
test) whose ``stats["data"]`` holds the raw round times in seconds.

Why runs, not rounds, are the unit. A benchmark's rounds run back to back in one pytest
process and share its clock frequency, core placement, allocator layout, thermal state and the
neighbours' load at that time, so they shift together: the spread of rounds inside a run
understates how much a second run would differ (docs/perf/gate-cpu.md has the figures measured
on a shared 2-vCPU VM).
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
`calibrated_run_noise` on repeated runs of the same code: the std of log medians across runs
(`estimate_run_noise`; it also contains the within-run noise of the median) raised to its 95%
upper confidence bound (`noise_upper_bound`), since a spread estimated from a few runs falls
below the true one about half the time, and a run_noise below the truth raises false alarms.
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
estimate is roughly t / 2 or more. `inferlab.suite.gate.simulate` measures both rules' FAIL
rates on synthetic runs of known slowdown (results in docs/perf/gate-cpu.md).

Suite: FAIL if any benchmark FAILs, else INCONCLUSIVE if any is, else PASS; exit codes 1, 3, 0.

For comparison, `pytest_benchmark_style` decides what ``--benchmark-compare-fail=median:X%``
would: fail when head median > base median x (1 + X), one run per side, no interval.
"""

from inferlab.suite.gate.load import FINGERPRINT_KEYS, MACHINE_KEYS, Run, Series, check_comparable, load_run
from inferlab.suite.gate.report import SCHEMA, format_table, report_dict, write_report_json
from inferlab.suite.gate.stats import (
    CALIBRATION_CONFIDENCE, DEFAULT_RUN_NOISE, bonferroni_level, bootstrap_log_ratios, calibrated_run_noise,
    estimate_run_noise, log_median, log_ratio, noise_upper_bound, percentile_interval, pytest_benchmark_style,
    replicates_for, resampled_mean_log_median,
)
from inferlab.suite.gate.thresholds import DEFAULT_THRESHOLD, THRESHOLD_EXAMPLE, parse_thresholds, threshold_for
from inferlab.suite.gate.verdict import EXIT_CODES, FAIL, INCONCLUSIVE, PASS, Report, Row, compare, suite_verdict, verdict

__all__ = [
    "CALIBRATION_CONFIDENCE",
    "DEFAULT_RUN_NOISE",
    "DEFAULT_THRESHOLD",
    "EXIT_CODES",
    "FAIL",
    "FINGERPRINT_KEYS",
    "INCONCLUSIVE",
    "MACHINE_KEYS",
    "PASS",
    "Report",
    "Row",
    "Run",
    "SCHEMA",
    "Series",
    "THRESHOLD_EXAMPLE",
    "bonferroni_level",
    "bootstrap_log_ratios",
    "check_comparable",
    "calibrated_run_noise",
    "compare",
    "estimate_run_noise",
    "format_table",
    "load_run",
    "log_median",
    "log_ratio",
    "noise_upper_bound",
    "parse_thresholds",
    "percentile_interval",
    "pytest_benchmark_style",
    "replicates_for",
    "report_dict",
    "resampled_mean_log_median",
    "suite_verdict",
    "threshold_for",
    "verdict",
    "write_report_json",
]
