"""Metric math on synthetic timestamps, with exact expected values."""

import numpy as np
import pytest

from inferlab.measure.metrics import RunTimes, percentiles, summarize


def test_ttft_tpot_e2e_and_itl_from_timestamps():
    run = RunTimes(token_ms=(10.0, 12.0, 15.0, 16.0))
    assert run.ttft_ms == 10.0
    assert run.e2e_ms == 16.0
    assert run.tpot_ms == 2.0  # (16 - 10) / 3
    assert run.itl_ms == (2.0, 3.0, 1.0)
    assert run.output_tokens_per_s == 250.0  # 4 tokens / 16 ms
    assert run.decode_tokens_per_s == 500.0


def test_tpot_is_undefined_for_a_single_token():
    run = RunTimes(token_ms=(7.0,))
    assert run.tpot_ms is None
    assert run.itl_ms == ()
    assert run.decode_tokens_per_s is None


def test_percentiles_interpolate_linearly_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    stats = percentiles(values)
    assert stats["p50"] == 3.0
    assert stats["p95"] == pytest.approx(8.8)  # 4 + 0.8 * (10 - 4)
    assert stats["p99"] == pytest.approx(9.76)
    assert stats["p95"] == float(np.percentile(values, 95))
    assert (stats["min"], stats["max"], stats["mean"]) == (1.0, 10.0, 4.0)


def test_summary_takes_ttft_across_runs_and_pools_itl_across_gaps():
    runs = [RunTimes((10.0, 12.0, 14.0)), RunTimes((20.0, 21.0, 25.0))]
    summary = summarize(runs, batch_size=4)
    assert summary["ttft_ms"]["p50"] == 15.0
    assert summary["ttft_ms"]["min"] == 10.0
    assert sorted([summary["itl_ms"]["min"], summary["itl_ms"]["max"]]) == [1.0, 4.0]
    assert summary["itl_ms"]["mean"] == 2.25  # gaps 2, 2, 1, 4
    assert summary["tpot_ms"]["p50"] == 2.25  # TPOTs 2.0 and 2.5
    assert summary["decode_tokens_per_s"] == pytest.approx(1000 / 2.25)
    assert summary["throughput_tokens_per_s"]["max"] == 4 * summary["output_tokens_per_s"]["max"]
