"""A torch.profiler trace of a few decode steps, taken after the timed runs, never inside them.

One more request runs, with the same prompt and settings as the measured ones. The profiler
advances one step at every token mark of the clock (the clock is a hook of the decode loop), so
its schedule picks whole decode steps: step 0 is the prefill, steps 1 and 2 are skipped and
warmed up on, and the next `steps` decode steps are recorded. A request too short for that
(fewer than `steps` + 4 tokens) is recorded whole, and "per step" then means per token.

The trace is a Chrome/Perfetto JSON file (open it in ui.perfetto.dev or chrome://tracing).
The summary ranks, per step, the GPU kernels by their time on the device, or on the CPU the
operators by their own (self) CPU time.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

import torch

from inferlab import storage

STEPS = 3
SKIPPED_STEPS = 2  # the prefill and the first decode step
WARMUP_STEPS = 1
KEPT_ROWS = 100


@dataclass(frozen=True)
class KernelTime:
    """One kernel (or CPU operator): time and calls per recorded step."""

    name: str
    us_per_step: float
    calls_per_step: float


@dataclass(frozen=True)
class ProfileSummary:
    """What a profile recorded, ranked by time per step, and its trace file's name."""

    device_type: str
    unit: str  # "kernels" (device time) or "operators" (self CPU time)
    steps: int
    window: str
    rows: tuple[KernelTime, ...]
    trace: str

    def to_dict(self) -> dict:
        return {**asdict(self), "rows": [asdict(r) for r in self.rows]}


def summary_from_dict(data: dict | None) -> ProfileSummary | None:
    if not data:
        return None
    rows = tuple(KernelTime(**r) for r in data["rows"])
    return ProfileSummary(data["device_type"], data["unit"], data["steps"], data["window"], rows, data["trace"])


def window(output_length: int, steps: int = STEPS) -> tuple[int, int] | None:
    """(first recorded step, steps recorded), or None when the request is too short: record it whole."""
    first = SKIPPED_STEPS + WARMUP_STEPS
    if output_length - 1 < first + steps:  # the last token's mark closes step N - 1
        return None
    return first, steps


class StepMarkingClock:
    """A TokenClock that also advances the profiler at every token mark."""

    def __init__(self, clock, profiler) -> None:
        self.clock, self.profiler = clock, profiler

    def start(self) -> None:
        self.clock.start()

    def mark(self) -> None:
        self.clock.mark()
        self.profiler.step()

    def finish(self):
        return self.clock.finish()


@dataclass(frozen=True)
class LaunchTime:
    """One kernel at one grid: device time, time added to the step, and launches per recorded step.

    `chain_us_per_step` is what the kernel adds to the step's busy time: its end minus the later of
    its start and the previous kernel's end. Under programmatic dependent launch a kernel starts
    while the one before still runs (its programs wait for it), so its duration counts that wait
    again; the chain times do not overlap, and they sum to the time the device was busy."""

    name: str
    grid: tuple[int, ...]
    us_per_step: float
    calls_per_step: float
    chain_us_per_step: float = 0.0


def _kernel_events(trace_events: Iterable[dict]) -> list[dict]:
    return sorted((e for e in trace_events if isinstance(e, dict) and e.get("cat") == "kernel"),
                  key=lambda e: e.get("ts", 0.0))


def whole_steps(trace_events: Iterable[dict], expected: int | None = None) -> tuple[list[dict], int]:
    """The kernel events of the whole steps in a trace, and how many there are.

    A recorded window may begin in the middle of a step (the profiler's warm-up step leaves
    kernels in the trace) and its edges do not fall on step boundaries. Every step of the fast
    engine ends with the same kernel (the greedy or sampling step), the last kernel the trace
    records: the events after its first launch up to its last are whole steps, one per launch
    between them. With fewer than two launches of it, or (given the `expected` steps) a count
    more than one away from it, as where the last kernel is one of many alike in a step (the
    eager engines' elementwise kernels): all the kernel events and 0 steps (unknown)."""
    kernels = _kernel_events(trace_events)
    if not kernels:
        return [], 0
    last = kernels[-1]
    closing = (last.get("name"), tuple(last.get("args", {}).get("grid", ())))
    ends = [i for i, e in enumerate(kernels) if (e.get("name"), tuple(e.get("args", {}).get("grid", ()))) == closing]
    steps = len(ends) - 1
    if steps < 1 or (expected is not None and abs(steps - expected) > 1):
        return kernels, 0
    return kernels[ends[0] + 1:ends[-1] + 1], steps


def kernel_launches(trace_events: Iterable[dict], steps: int) -> tuple[LaunchTime, ...]:
    """The kernel events (cat "kernel") of a Chrome trace's `traceEvents`, summed per (name, grid)
    and divided by `steps`, in the order of each one's first launch. One kernel serving several
    matrices (a projection kernel launched for [q; k; v], o, [gate; up] and down) has a grid for
    each, so each matrix gets its own row, where `rank_events` adds them under the kernel's name."""
    totals: dict[tuple[str, tuple[int, ...]], list[float]] = {}
    previous_end = float("-inf")
    for event in _kernel_events(trace_events):
        key = (str(event.get("name", "")), tuple(event.get("args", {}).get("grid", ())))
        start, duration = float(event.get("ts", 0.0)), float(event.get("dur", 0.0))
        end = start + duration
        total = totals.setdefault(key, [0.0, 0, 0.0])
        total[0] += duration
        total[1] += 1
        total[2] += max(0.0, end - max(start, previous_end))
        previous_end = max(previous_end, end)
    return tuple(LaunchTime(name, grid, us / steps, calls / steps, chain / steps)
                 for (name, grid), (us, calls, chain) in totals.items())


def trace_ranking(trace_events: Iterable[dict], expected: int, top: int = KEPT_ROWS) -> tuple[tuple[KernelTime, ...], int]:
    """Kernels by device time per step, largest first, over the whole steps of a Chrome trace
    (`whole_steps`, about `expected` of them), and how many steps that is; ((), 0) where they
    cannot be told. The profiler's own averages count every kernel its window caught, a partial
    step's included."""
    kept, steps = whole_steps(trace_events, expected)
    if not steps:
        return (), 0
    totals: dict[str, list[float]] = {}
    for event in kept:
        total = totals.setdefault(str(event.get("name", "")), [0.0, 0])
        total[0] += float(event.get("dur", 0.0))
        total[1] += 1
    rows = [KernelTime(name, us / steps, calls / steps) for name, (us, calls) in totals.items()]
    rows.sort(key=lambda r: (-r.us_per_step, r.name))
    return tuple(rows[:top]), steps


def _trace_events(trace: bytes) -> list:
    """The `traceEvents` of a Chrome trace's bytes; [] where they cannot be read."""
    try:
        events = json.loads(trace).get("traceEvents", [])
    except (ValueError, AttributeError):
        return []
    return events if isinstance(events, list) else []


def _is_device_event(event) -> bool:
    return str(getattr(event, "device_type", "")).upper().endswith("CUDA")


def rank_events(events: Iterable, on_device: bool, steps: int, top: int = KEPT_ROWS) -> tuple[KernelTime, ...]:
    """Kernels (device events, by self device time) or CPU operators (by self CPU time), per step, largest first."""
    rows = []
    for event in events:
        if event.key.startswith("ProfilerStep"):
            continue
        if on_device:
            if not _is_device_event(event):
                continue
            micros = event.self_device_time_total
        else:
            micros = event.self_cpu_time_total
        if micros > 0:
            rows.append(KernelTime(event.key, micros / steps, event.count / steps))
    rows.sort(key=lambda r: (-r.us_per_step, r.name))
    return tuple(rows[:top])


def profile_request(engine, prompt, decode, generator, clock, device: torch.device, trace_path: Path,
                    steps: int = STEPS) -> ProfileSummary:
    """Run one request under torch.profiler; write its trace to `trace_path` (new file); return the ranking."""
    from torch.profiler import ProfilerActivity, profile, schedule

    trace_path = Path(trace_path)
    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    picked = window(decode.max_new_tokens, steps)
    with tempfile.TemporaryDirectory(dir=trace_path.parent) as scratch:
        raw = Path(scratch) / "trace.json"
        if picked is None:
            with profile(activities=activities) as profiler:
                engine.run(prompt, decode, generator, clock)
                clock.finish()
            profiler.export_chrome_trace(str(raw))
            recorded, where = decode.max_new_tokens, f"the whole request ({decode.max_new_tokens} tokens)"
        else:
            first, recorded = picked
            plan = schedule(skip_first=SKIPPED_STEPS, wait=0, warmup=WARMUP_STEPS, active=recorded, repeat=1)
            with profile(activities=activities, schedule=plan,
                         on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as profiler:
                marking = StepMarkingClock(clock, profiler)
                engine.run(prompt, decode, generator, marking)
                marking.finish()
            where = f"decode steps {first}-{first + recorded - 1}"
        trace = raw.read_bytes()
        storage.write_bytes_atomic(trace_path, trace)
    events = profiler.key_averages()
    rows, whole = trace_ranking(_trace_events(trace), recorded) if on_device and picked is not None else ((), 0)
    if whole:  # the kernels of whole steps: the window also catches part of the step before it
        recorded, where = whole, f"{where}: {whole} whole steps of the trace"
    else:
        rows = rank_events(events, on_device, recorded)
    unit = "kernels" if on_device else "operators"
    if on_device and not rows:  # no kernel events came back (CUPTI unavailable): rank the operators instead
        rows, unit = rank_events(events, False, recorded), "operators"
    return ProfileSummary(device.type, unit, recorded, where, rows, trace_path.name)
