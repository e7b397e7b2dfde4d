"""The benchmark runner: raw samples kept, JSON round-trip, engines agree, bad input refused."""

import json

import pytest
import torch

from inferlab.measure.bench import (SCHEMA, BenchConfig, decode_config, build_prompt, repeat_within_budget, result_from_dict,
                                    run_benchmark)
from inferlab.decode.engines import make_engine
from inferlab.errors import UsageError
from inferlab.measure.clocks import HostClock


def test_result_keeps_every_raw_timestamp_and_round_trips_through_json(tiny):
    result = run_benchmark(tiny, BenchConfig(prompt_length=6, output_length=5, warmup_runs=1, runs=3))
    assert len(result.runs) == 3 and all(r.num_tokens == 5 for r in result.runs)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["schema"] == SCHEMA
    again = result_from_dict(data)
    assert again.runs == result.runs
    assert again.summary == result.summary
    assert again.config == result.config
    fp = data["fingerprint"]
    for key in ("device_name", "torch", "transformers", "model", "dtype", "engine", "prompt_length", "batch_size", "output_length"):
        assert key in fp
    assert (fp["model"], fp["dtype"], fp["engine"], fp["output_length"]) == ("tiny-random", "fp32", "eager", 5)


def test_wall_clock_brackets_the_token_timestamps(tiny):
    result = run_benchmark(tiny, BenchConfig(prompt_length=4, output_length=4, warmup_runs=0, runs=2))
    for run in result.runs:
        assert run.wall_ms >= run.e2e_ms


def test_result_from_dict_rejects_other_files():
    with pytest.raises(UsageError, match="not an inferlab benchmark result"):
        result_from_dict({"schema": "something/else"})


@pytest.mark.parametrize("engine", ["hf", "hf-static"])
def test_generate_engines_produce_the_eager_loops_tokens(tiny, engine):
    config = BenchConfig(prompt_length=9, output_length=7, batch_size=2)
    prompt, decode = build_prompt(tiny, config), decode_config(tiny, config)
    eager = make_engine("eager", tiny.model).run(prompt, decode, None, HostClock())
    clock = HostClock()
    other = make_engine(engine, tiny.model).run(prompt, decode, None, clock)
    assert torch.equal(eager, other)
    assert len(clock.finish()) == 7  # one mark per generated token


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(output_length=0), "output length must be a positive integer, got 0"),
        (dict(prompt_length=-3), "prompt length must be a positive integer, got -3"),
        (dict(batch_size=0), "batch size must be a positive integer, got 0"),
        (dict(runs=0), "runs must be at least 1, got 0"),
        (dict(engine="vllm"), "unknown engine 'vllm'"),
    ],
)
def test_bad_configurations_are_refused_with_one_line(kwargs, message):
    with pytest.raises(UsageError, match=message):
        BenchConfig(**kwargs)


def test_output_beyond_the_context_is_refused_before_running(tiny):
    with pytest.raises(UsageError, match=r"prompt \(500\) \+ output \(20\) tokens exceed tiny-random's context of 512"):
        run_benchmark(tiny, BenchConfig(prompt_length=500, output_length=20))


def test_saved_files_are_ordinary_readable_files(tmp_path):
    import os
    import stat

    from inferlab.storage import write_text_atomic

    mask = os.umask(0o022)
    try:
        path = write_text_atomic(tmp_path / "a.json", "{}")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary left behind


class Ticks:
    """A fake clock: each request takes `seconds` of it."""

    def __init__(self, seconds: float) -> None:
        self.now, self.seconds, self.requests = 0.0, seconds, 0

    def __call__(self) -> float:
        return self.now

    def request(self):
        self.requests += 1
        self.now += self.seconds
        return self.requests


@pytest.mark.parametrize("seconds_each, budget, expected", [
    (0.1, 5.0, 10),   # quick requests: all the rounds asked for
    (2.0, 5.0, 3),    # 3 requests pass the budget (6 s): stop there
    (10.0, 5.0, 3),   # slow requests: never fewer than the minimum
    (10.0, 0.0, 10),  # no budget
])
def test_repeat_within_budget_stops_at_the_rounds_or_the_budget_never_below_the_minimum(seconds_each, budget, expected):
    clock = Ticks(seconds_each)
    runs = repeat_within_budget(clock.request, rounds=10, budget_s=budget, min_rounds=3, clock=clock)
    assert runs == list(range(1, expected + 1))
