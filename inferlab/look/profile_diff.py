"""Which kernels grew: two profiles of the same configuration, compared per decode step.

Each profile is the summary `inferlab bench --profile` (or `sweep --profile`) saves in its
result JSON: time per recorded step for each kernel (GPU) or operator (CPU). A kernel absent
from one side counts 0 there. Changes are ranked by head - base (us per step), largest growth first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inferlab.errors import UsageError
from inferlab.measure.profiling import ProfileSummary, summary_from_dict


@dataclass(frozen=True)
class KernelChange:
    """One kernel's time per step on each side (0 where it did not run)."""

    name: str
    base_us: float
    head_us: float

    @property
    def delta_us(self) -> float:
        return self.head_us - self.base_us


def kernel_diff(base: ProfileSummary, head: ProfileSummary, top: int = 10) -> tuple[KernelChange, ...]:
    """The `top` kernels whose time per step grew most (only those that grew)."""
    base_us = {r.name: r.us_per_step for r in base.rows}
    head_us = {r.name: r.us_per_step for r in head.rows}
    changes = [KernelChange(name, base_us.get(name, 0.0), head_us.get(name, 0.0)) for name in base_us.keys() | head_us.keys()]
    grown = sorted((c for c in changes if c.delta_us > 0), key=lambda c: (-c.delta_us, c.name))
    return tuple(grown[:top])


def load_profile(path: Path) -> ProfileSummary:
    """The profile summary in a bench result JSON (``bench.json`` or a sweep's ``results/*.json``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot read profile {path} ({error.__class__.__name__}): pass a bench.json written "
                         "by `inferlab bench --profile`") from None
    summary = summary_from_dict(data.get("profile")) if isinstance(data, dict) else None
    if summary is None:
        raise UsageError(f"{path} holds no profile: run `inferlab bench --profile` and pass its bench.json")
    return summary


def format_kernel_diff(changes: tuple[KernelChange, ...], base: ProfileSummary, head: ProfileSummary) -> str:
    """A table of the kernels that grew, with the steps' totals on each side."""
    base_total = sum(r.us_per_step for r in base.rows)
    head_total = sum(r.us_per_step for r in head.rows)
    unit = base.unit if base.unit == head.unit else f"{base.unit}/{head.unit}"
    lines = [f"profile diff: {unit} whose time per step grew most (base {base_total:.1f} us/step, "
             f"head {head_total:.1f} us/step, {base.window} vs {head.window})"]
    if not changes:
        return "\n".join(lines + ["  no kernel grew"])
    lines.append(f"  {'base us':>10} {'head us':>10} {'+us':>10}  name")
    lines += [f"  {c.base_us:>10.1f} {c.head_us:>10.1f} {c.delta_us:>+10.1f}  {c.name[:100]}" for c in changes]
    return "\n".join(lines)
