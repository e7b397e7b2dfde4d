"""Top-up rounds: more runs for the groups whose hypotheses are still INCONCLUSIVE, and when to stop.

After a sweep's base rounds each group (engine, prompt length, batch size) is judged on the runs
so far. A group is undecided while any of its verdicts is INCONCLUSIVE (NOT ENOUGH DATA is not:
more runs add no output lengths). While some group is undecided, one more round measures each of
the undecided groups' configurations once, and the groups are judged again. A group stops:

- "decided": none of its verdicts is INCONCLUSIVE any more;
- "max runs": its configurations have `max_runs` runs each;
- "budget": the next round would take the top-up past its budget of seconds (a round is estimated
  as the sum of the latest run of each configuration it would measure);
- "interrupted": Ctrl-C or SIGTERM came first.

Looking again after every round and stopping once decided is optional stopping: each look is
one more chance for a noisy interval to land wholly outside (or inside) a tolerance. Every look
judges at the hypotheses' own 95%, as a fixed number of runs would: on simulated sweeps with the
CPU VM's noise (docs/perf/cpu/top-up.md) the later looks added one false DOES NOT HOLD in 3,500
sweeps and no missed violation, while sharing the 5% among the eight looks (Bonferroni) cost a
fifth to a half of the decided verdicts and removed only that one false alarm (the others came
from the base runs). A saved sweep judged again (`saved_group_verdicts`) gives the verdicts it
printed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from inferlab.suite import hypotheses

DECIDED = "decided"
MAX_RUNS = "max runs"
BUDGET = "budget"
INTERRUPTED = "interrupted"
STOP_REASONS = (DECIDED, MAX_RUNS, BUDGET, INTERRUPTED)


@dataclass(frozen=True)
class GroupTopUp:
    """How one group's top-up went: the rounds that measured it after the base rounds, and why they stopped."""

    engine: str
    prompt_length: int
    batch_size: int
    rounds: int
    stopped: str  # one of STOP_REASONS

    def __post_init__(self) -> None:
        assert self.stopped in STOP_REASONS, self.stopped

    def to_dict(self) -> dict:
        return asdict(self)


def is_undecided(verdicts: Sequence[hypotheses.Verdict]) -> bool:
    """Some verdict is INCONCLUSIVE: more runs could decide it."""
    return any(v.verdict == hypotheses.INCONCLUSIVE for v in verdicts)


def fits_budget(spent_s: float, round_s: float, budget_s: float) -> bool:
    """Whether a round estimated at `round_s` still ends within `budget_s`, `spent_s` having gone to earlier rounds."""
    return spent_s + round_s <= budget_s


def judge_topped_up(judge: Callable[[int, float], Sequence[hypotheses.Verdict]], runs: int, max_runs: int,
                    confidence: float) -> tuple[Sequence[hypotheses.Verdict], int]:
    """The stop rule without a clock: `judge(n, confidence)` on n = runs, runs + 1, ... until nothing is
    INCONCLUSIVE or n = max_runs; the last verdicts and their n (what a sweep with an unlimited budget ends with)."""
    n = runs
    verdicts = judge(n, confidence)
    while is_undecided(verdicts) and n < max_runs:
        n += 1
        verdicts = judge(n, confidence)
    return verdicts, n
