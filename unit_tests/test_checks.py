"""The package code behind the measurement scripts: the teacher-forced check, the clock's cost,
graph-replay timing and the gate simulation."""

import math

import pytest
import torch

from inferlab.decode.engines import make_engine
from inferlab.decode.loop import DecodeConfig
from inferlab.decode.prompts import random_prompt
from inferlab.fast.check import teacher_forced_check
from inferlab.fast.engine import FastEngine, FastOptions
from inferlab.measure.clock_cost import timer_cost
from inferlab.measure.clocks import HostClock
from inferlab.suite.gate import FAIL, simulate


def test_in_fp32_the_fast_engine_passes_its_own_check(tiny):
    """fp32 on the CPU: fast and eager compute the same function, so the check reports agreement
    everywhere and errors at float32 rounding (1e-4 on logits of size ~1)."""
    prompt = random_prompt(tiny.model.config.vocab_size, 5, 1, torch.Generator().manual_seed(0), tiny.device)
    check = teacher_forced_check(tiny, prompt, 6, FastEngine(tiny.model, FastOptions(compile=False, graphs=False)))
    assert check["greedy_token_agreement_fast_vs_eager"] == 1.0 and check["first_divergence_step"] is None
    assert check["fp32_gap_where_free_running_parts"] is None
    assert check["teacher_forced_top1_agreement_fast_vs_eager"] == 1.0
    assert check["max_abs_logit_diff_fast_vs_eager"] < 1e-4
    assert check["max_abs_logit_err_fast_vs_fp32"] < 1e-4 and check["max_abs_logit_err_eager_vs_fp32"] < 1e-4


def test_where_the_free_running_tokens_part_the_check_gives_the_fp32_gap_between_the_two_picks(tiny):
    """An engine that picks another token at step 2: the check names the step and how far apart the
    fp32 reference holds the two tokens there, on the prefix both had seen."""
    prompt = random_prompt(tiny.model.config.vocab_size, 5, 1, torch.Generator().manual_seed(0), tiny.device)
    real = FastEngine(tiny.model, FastOptions(compile=False, graphs=False))

    class PartingEngine:
        options, kernels = real.options, None

        def prepare(self, prompt, config):
            real.prepare(prompt, config)

        def run(self, prompt, config, generator, clock):
            tokens = real.run(prompt, config, generator, clock).clone()
            tokens[0, 2] = (tokens[0, 2] + 1) % tiny.model.config.vocab_size
            self.tokens = tokens
            return tokens

    engine = PartingEngine()
    check = teacher_forced_check(tiny, prompt, 6, engine)
    assert check["first_divergence_step"] == 2 and check["greedy_token_agreement_fast_vs_eager"] == 5 / 6
    assert check["fast_tokens"] == engine.tokens[0].tolist() and check["eager_tokens"][:2] == check["fast_tokens"][:2]
    eager = real.run(prompt, DecodeConfig(6, ignore_eos=True), None, HostClock())
    with torch.inference_mode():
        logits = tiny.model(input_ids=torch.cat([prompt.input_ids, eager[:, :2]], dim=1)).logits[0, -1]
    expected = (logits[eager[0, 2]] - logits[engine.tokens[0, 2]]).abs().item()
    assert check["fp32_gap_where_free_running_parts"] == pytest.approx(expected, abs=1e-5)  # fp32, another order
    assert check["fp32_gap_where_free_running_parts"] > 0


def test_timer_cost_pairs_both_clocks_on_the_same_requests(tiny):
    cost = timer_cost(tiny, make_engine("eager", tiny.model), 3, 4, 5)
    assert cost["engine"] == "eager" and cost["pairs"] == 3
    assert cost["tpot_ms_per_token_events_p50"] > 0 and cost["tpot_ms_endpoint_events_p50"] > 0
    assert math.isclose(cost["relative_cost"],
                        cost["tpot_ms_per_token_events_p50"] / cost["tpot_ms_endpoint_events_p50"] - 1)


def test_simulated_gate_fails_a_large_slowdown_and_rarely_an_unchanged_run():
    result = simulate.simulate(pairs=15, threshold=0.05, confidence=0.95, run_noise=0.005, within=0.01, rounds=10,
                               entries=2, seed=1)
    rates = result["rates"]
    assert set(rates) == {"0%", "2.5%", "5%", "10%"}
    assert rates["0%"]["gate"][FAIL] <= 0.1  # bounded by (1 - c) / 2 per entry in expectation
    assert rates["10%"]["gate"][FAIL] >= 0.9  # twice the threshold, with 0.5% run noise
    assert all(math.isclose(sum(r.values()), 1.0) for method in rates.values() for r in method.values())


@pytest.mark.gpu
def test_graph_timing_replays_every_launch(cuda_device):
    from inferlab.measure.graph_timing import time_per_launch_us

    counter = torch.zeros((), device=cuda_device)
    us = time_per_launch_us([lambda: counter.add_(1), lambda: counter.add_(1)], replays=3, repeats=2)
    torch.cuda.synchronize()
    # 2 launches: once warming up on a side stream, once to check the captured graph, then 3 x 2 replays
    assert counter.item() == 2 * (1 + 1 + 3 * 2)
    assert us > 0
