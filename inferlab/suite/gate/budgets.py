"""Absolute budgets (SLOs): TPOT <= X ms, TTFT p99 <= Y ms, TPOT <= k x the roofline floor.

A budget is a key and a number, the same in every place it can be set:

    ttft_ms=30          the median TTFT of the head runs is at most 30 ms
    tpot_ms_p99=1.2     their p99 TPOT (of rounds) is at most 1.2 ms; itl_ms_p99: of the pooled gaps
    tpot_floor_x=1.5    their median TPOT is at most 1.5 x the roofline floor saved with the run
                        (bytes per step / bandwidth), a budget that holds across GPUs

Where: on the command line (``--budget [PATTERN:]KEY=VALUE``, PATTERN an fnmatch on the case id,
e.g. ``fast-*``), on the test (``@pytest.mark.inferlab_budget(tpot_ms=1.0)``) or in
``pyproject.toml`` (``[tool.inferlab.budgets]``, one inline table per pattern). The plugin saves
the budgets of each entry in its extra_info, so they travel with the run.

Judged on the head runs alone: value = exp(mean_r log s_r), s_r the run's median (or quantile),
with the gate's hierarchical-bootstrap interval [low, high] at the family's level:
PASS if high <= limit, FAIL if low > limit, else INCONCLUSIVE.
"""

from __future__ import annotations

import fnmatch
import math
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from inferlab.errors import UsageError
from inferlab.suite.gate.extras import Extras, floor_tpot_ms
from inferlab.suite.gate.load import Run
from inferlab.suite.gate.quantiles import mean_log_quantile, resampled_mean_log_quantile, tail_fraction
from inferlab.suite.gate.stats import percentile_interval
from inferlab.suite.gate.tails import tail_values
from inferlab.suite.gate.verdict import FAIL, INCONCLUSIVE, PASS

BUDGET_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms", "itl_ms")


BUDGET_EXAMPLE = "write e.g. tpot_ms=1.0, ttft_ms_p99=30, tpot_floor_x=1.5 or fast-*:tpot_ms=1.0"


_KEY = re.compile(r"^(ttft_ms|tpot_ms|e2e_ms|itl_ms)(?:_(p\d{1,2}(?:\.\d+)?))?$")


@dataclass(frozen=True)
class Budget:
    """metric's stat <= limit ms (or <= limit x the roofline floor), for the cases `pattern` matches."""

    metric: str
    stat: str  # "median" or a tail such as "p99"
    limit: float
    per_floor: bool = False
    pattern: str = "*"
    source: str = "command line"

    @property
    def text(self) -> str:
        unit = " x floor" if self.per_floor else " ms"
        return f"{self.metric} {self.stat} <= {self.limit:g}{unit}"


def parse_budget(key: str, value: object, pattern: str = "*", source: str = "command line") -> Budget:
    """One KEY=VALUE budget; ValueError saying what to write."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"budget {key}={value!r}: the limit must be a positive number; {BUDGET_EXAMPLE}")
    if key == "tpot_floor_x":
        if value < 1:
            raise ValueError(f"budget {key}={value}: no step beats the roofline floor, give a factor >= 1")
        return Budget("tpot_ms", "median", float(value), True, pattern, source)
    match = _KEY.match(key)
    if not match:
        raise ValueError(f"budget {key!r} is not a budget key; {BUDGET_EXAMPLE}")
    stat = match.group(2) or "median"
    if stat != "median":
        tail_fraction(stat)
    return Budget(match.group(1), stat, float(value), False, pattern, source)


def parse_budget_option(text: str) -> Budget:
    """'[PATTERN:]KEY=VALUE' from --budget; UsageError naming the problem."""
    pattern, _, assignment = text.rpartition(":")
    key, equals, value = assignment.partition("=")
    try:
        if not equals:
            raise ValueError(f"--budget {text!r} has no '='; {BUDGET_EXAMPLE}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--budget {text!r}: {value!r} is not a number; {BUDGET_EXAMPLE}") from None
        return parse_budget(key.strip(), number, pattern.strip() or "*")
    except ValueError as error:
        raise UsageError(str(error)) from None


def budgets_from_table(table: object, source: str) -> list[Budget]:
    """[tool.inferlab.budgets]: {pattern: {key: value}} -> budgets; ValueError naming the bad entry."""
    if not isinstance(table, dict):
        raise ValueError(f"{source}: [tool.inferlab.budgets] must map case patterns to tables, e.g. \"fast-*\" = {{ tpot_ms = 1.0 }}")
    budgets = []
    for pattern, keys in table.items():
        if not isinstance(keys, dict):
            raise ValueError(f"{source}: budgets for {pattern!r} must be a table, e.g. {{ tpot_ms = 1.0 }}")
        budgets.extend(parse_budget(key, value, pattern, source) for key, value in keys.items())
    return budgets


def read_pyproject_budgets(path: Path) -> list[Budget]:
    """The budgets of [tool.inferlab.budgets] in a pyproject.toml ([] when there is none)."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"cannot read budgets from {path}: {error.strerror}") from None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: only a file that sets budgets needs the parser
        if "tool.inferlab.budgets" in text:
            raise ValueError(f"{path} sets [tool.inferlab.budgets], which needs Python 3.11+ (tomllib) to read") from None
        return []
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"cannot read budgets from {path}: {error}") from None
    table = data.get("tool", {}).get("inferlab", {}).get("budgets")
    return [] if table is None else budgets_from_table(table, str(path))


def case_id(name: str) -> str:
    """The parametrization id of a test name: 'test_x[fast-b1-p128-n128-tpot_ms]' -> 'fast-b1-p128-n128-tpot_ms'."""
    return name[name.index("[") + 1:-1] if name.endswith("]") and "[" in name else name


def applies(budget: Budget, name: str, metric: str) -> bool:
    """Whether a budget judges an entry of this name and metric (ITL budgets judge TPOT entries)."""
    wanted = "tpot_ms" if budget.metric == "itl_ms" else budget.metric
    return wanted == metric and (fnmatch.fnmatchcase(case_id(name), budget.pattern) or fnmatch.fnmatchcase(name, budget.pattern))


def saved_budgets(extras: Extras, fullname: str) -> list[Budget]:
    """The budgets the plugin saved with an entry (extra_info['budgets'])."""
    saved = extras.extra_info.get(fullname, {}).get("budgets") or []
    try:
        return [parse_budget(item["key"], item["value"], "*", str(item.get("source") or "saved")) for item in saved]
    except (TypeError, KeyError, ValueError) as error:
        raise UsageError(f"{fullname}: budgets saved in extra_info are unreadable ({error}): re-run the benchmarks") from None


@dataclass(frozen=True)
class BudgetRow:
    """One budget judged on the head runs: value and interval (ms), the limit (ms), verdict."""

    fullname: str
    name: str
    budget: Budget
    value_ms: float
    ci_low_ms: float
    ci_high_ms: float
    limit_ms: float
    verdict: str


def budget_verdict(low: float, high: float, limit: float) -> str:
    """PASS if high <= limit; FAIL if low > limit; else INCONCLUSIVE."""
    if high <= limit:
        return PASS
    return FAIL if low > limit else INCONCLUSIVE


def limit_ms(budget: Budget, head: Sequence[tuple[Run, Extras]], fullname: str) -> float:
    """The budget in ms: as given, or the factor x the geometric mean of the head runs' roofline floors."""
    if not budget.per_floor:
        return budget.limit
    floors = [floor_tpot_ms(extras, fullname) for _, extras in head]
    if any(f is None for f in floors):
        raise UsageError(f"{fullname}: budget {budget.text} needs the roofline floor in extra_info, which a head run lacks: "
                         "re-run the benchmarks with this version of the plugin")
    return budget.limit * math.exp(np.mean(np.log(floors)))


def budget_row(fullname: str, budget: Budget, head: Sequence[tuple[Run, Extras]], level: float, replicates: int,
               run_noise: float, seed: int) -> BudgetRow:
    """Judge one budget on the head runs (see the module docstring)."""
    runs = [tail_values(run, extras, fullname, budget.metric) if budget.metric == "itl_ms"
            else np.asarray([[r] for r in run.get(fullname).rounds_ms]) for run, extras in head]
    if any(r is None for r in runs):
        raise UsageError(f"{fullname}: budget {budget.text} needs per-token gaps, which a head run did not save: "
                         "re-run the benchmarks with this version of the plugin")
    q = 0.5 if budget.stat == "median" else tail_fraction(budget.stat)
    rng = np.random.default_rng([seed, zlib.crc32(f"{fullname}|{budget.text}".encode())])
    low, high = percentile_interval(resampled_mean_log_quantile(runs, q, replicates, run_noise, rng), level)
    limit = limit_ms(budget, head, fullname)
    return BudgetRow(fullname, head[0][0].get(fullname).name, budget, math.exp(mean_log_quantile(runs, q)),
                     low, high, limit, budget_verdict(low, high, limit))
