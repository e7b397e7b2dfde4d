"""Latency metrics, each derived from raw per-token timestamps.

For one request producing N tokens per sequence, with t_i the time (ms, from the start of the
request) at which token i was produced:

- TTFT = t_0 (prefill + first token)
- E2E (total latency) = t_{N-1}
- TPOT = (E2E - TTFT) / (N - 1), defined for N > 1
- ITL = t_i - t_{i-1} for i >= 1 (one per gap; pooled across runs as a distribution)
- output tokens/s = N / E2E (per sequence); throughput = B x N / E2E
- decode tokens/s = 1 / TPOT (per sequence)

Percentiles use numpy's linear interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class RunTimes:
    """One measured request: token_ms[i] = ms from the request's start to token i.

    `wall_ms`, when present, is a host clock read over the whole request with the device
    synchronized before and after: an independent check of the event timestamps.
    """

    token_ms: tuple[float, ...]
    wall_ms: float | None = None

    def __post_init__(self) -> None:
        assert len(self.token_ms) >= 1, "a run produces at least one token"

    @property
    def num_tokens(self) -> int:
        return len(self.token_ms)

    @property
    def ttft_ms(self) -> float:
        return self.token_ms[0]

    @property
    def e2e_ms(self) -> float:
        return self.token_ms[-1]

    @property
    def tpot_ms(self) -> float | None:
        if self.num_tokens < 2:
            return None
        return (self.e2e_ms - self.ttft_ms) / (self.num_tokens - 1)

    @property
    def itl_ms(self) -> tuple[float, ...]:
        return tuple(b - a for a, b in zip(self.token_ms, self.token_ms[1:]))

    @property
    def output_tokens_per_s(self) -> float:
        return self.num_tokens / (self.e2e_ms / 1e3)

    @property
    def decode_tokens_per_s(self) -> float | None:
        tpot = self.tpot_ms
        return None if tpot is None or tpot <= 0 else 1e3 / tpot


def percentiles(values: list[float] | tuple[float, ...]) -> dict[str, float]:
    """p50/p95/p99 (linear interpolation) plus mean, min and max of `values`."""
    array = np.asarray(values, dtype=float)
    out = {f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES}
    out.update(mean=float(array.mean()), min=float(array.min()), max=float(array.max()))
    return out


def summarize(runs: list[RunTimes], batch_size: int) -> dict[str, dict[str, float] | float | None]:
    """Every reported statistic, derived from the raw runs.

    TTFT, E2E, TPOT and tokens/s are distributions across runs; ITL pools every gap of every run.
    """
    tpots = [r.tpot_ms for r in runs if r.tpot_ms is not None]
    itls = [gap for r in runs for gap in r.itl_ms]
    tps = [r.output_tokens_per_s for r in runs]
    summary: dict = {
        "ttft_ms": percentiles([r.ttft_ms for r in runs]),
        "e2e_ms": percentiles([r.e2e_ms for r in runs]),
        "tpot_ms": percentiles(tpots) if tpots else None,
        "itl_ms": percentiles(itls) if itls else None,
        "output_tokens_per_s": percentiles(tps),
        "throughput_tokens_per_s": percentiles([batch_size * t for t in tps]),
    }
    summary["decode_tokens_per_s"] = 1e3 / summary["tpot_ms"]["p50"] if tpots and summary["tpot_ms"]["p50"] > 0 else None
    return summary
