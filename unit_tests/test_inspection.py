"""`inferlab env`, `inspect` and `trace`: counts, config and every traced shape, checked by hand."""

import json

import pytest
import torch

from inferlab.cli import main
from inferlab.errors import UsageError
from inferlab.look.inspection import environment_report, format_environment, inspect_model, module_kind
from inferlab.decode.prompts import random_prompt
from inferlab.look.trace import evaluate, format_trace, mismatches, trace_forward

CPU = torch.device("cpu")

# tiny-random: vocab 512, hidden 64, intermediate 128, 2 layers, 4 heads, 2 KV heads (head dim 16), untied.
EMBEDDING = 512 * 64
ATTENTION = 2 * (64 * 64 + 64 * 32 + 64 * 32 + 64 * 64)  # q, k, v, o per layer
MLP = 2 * (3 * 64 * 128)  # gate, up, down per layer
NORM = 2 * (2 * 64) + 64  # two per layer, plus the final norm


def prompt_of(model, length, batch=1):
    return random_prompt(model.config.vocab_size, length, batch, torch.Generator().manual_seed(0), CPU)


def test_parameters_are_counted_by_module_kind(tiny):
    report = inspect_model(tiny)
    assert report.parameters_by_kind == {
        "embedding": EMBEDDING, "lm_head": EMBEDDING, "attention": ATTENTION, "mlp": MLP, "norm": NORM,
    }
    assert report.parameters == 2 * EMBEDDING + ATTENTION + MLP + NORM == 139_584
    assert report.weight_bytes == 4 * report.parameters
    assert report.parameters_by_dtype == {"fp32": report.parameters}
    assert report.devices == ("cpu",)
    assert report.tied_embeddings is False
    assert report.cuda_allocated_bytes is None


def test_config_summary_derives_head_dim_and_gqa_group(tiny):
    config = inspect_model(tiny).config
    assert (config["layers"], config["hidden_size"], config["intermediate_size"]) == (2, 64, 128)
    assert (config["attention_heads"], config["kv_heads"], config["head_dim"]) == (4, 2, 16)
    assert config["query_heads_per_kv_head"] == 2
    assert (config["vocab_size"], config["max_position_embeddings"]) == (512, 512)
    assert config["rope"]["rope_theta"] == 10000.0


def test_kv_cache_bytes_per_position_is_two_by_layers_by_kv_heads_by_head_dim(tiny):
    assert inspect_model(tiny).kv_bytes_per_position == 2 * 2 * 2 * 16 * 4


@pytest.mark.slow
def test_tied_embeddings_are_reported_and_counted_once(smollm2):
    report = inspect_model(smollm2)
    assert report.tied_embeddings is True
    assert "lm_head" not in report.parameters_by_kind
    assert report.parameters == sum(p.numel() for p in smollm2.model.parameters()) == 134_515_008


@pytest.mark.parametrize("name, kind", [
    ("model.embed_tokens.weight", "embedding"), ("model.layers.3.self_attn.k_proj.weight", "attention"),
    ("model.layers.0.mlp.down_proj.weight", "mlp"), ("model.layers.0.input_layernorm.weight", "norm"),
    ("model.norm.weight", "norm"), ("lm_head.weight", "lm_head"), ("score.weight", "other"),
])
def test_module_kind_follows_the_parameter_name(name, kind):
    assert module_kind(name) == kind


def test_environment_report_names_versions_and_devices():
    report = environment_report()
    assert report.cuda_available == torch.cuda.is_available()
    assert len(report.devices) == (torch.cuda.device_count() if report.cuda_available else 0)
    text = format_environment(report)
    assert f"torch            {torch.__version__}" in text and "transformers" in text and "CUDA available" in text


def test_every_traced_shape_matches_its_symbols(tiny):
    trace = trace_forward(tiny.model, prompt_of(tiny.model, 5, batch=2))
    assert trace.stages and mismatches(trace) == []
    assert trace.dims == {"B": 2, "H": 64, "nH": 4, "nKV": 2, "D": 16, "I": 128, "V": 512}


def test_trace_shows_gqa_and_the_cache_growing_by_one(tiny):
    trace = trace_forward(tiny.model, prompt_of(tiny.model, 5))
    shapes = {(s.phase, s.name): s.shape for s in trace.stages}
    assert shapes["prefill", "query heads (view)"] == (1, 4, 5, 16)
    assert shapes["prefill", "key heads (view)"] == (1, 2, 5, 16)  # half as many key heads: GQA
    assert shapes["prefill", "KV cache keys"] == (1, 2, 5, 16)
    assert shapes["decode", "KV cache keys"] == (1, 2, 6, 16)
    assert shapes["decode", "q projection"] == (1, 1, 64)
    assert shapes["decode", "LM head logits"] == (1, 1, 512)
    assert shapes["prefill", "RoPE cos"] == (1, 5, 16)


def test_trace_records_one_layer_unless_all_are_asked_for(tiny):
    prompt = prompt_of(tiny.model, 3)
    one = trace_forward(tiny.model, prompt)
    every = trace_forward(tiny.model, prompt, all_layers=True)
    assert {s.module for s in one.stages if ".layers.1." in s.module} == set()
    assert any(".layers.1." in s.module for s in every.stages)
    assert len(every.stages) > len(one.stages)


def test_trace_leaves_no_hooks_and_agrees_with_the_decode_loop(tiny):
    from inferlab.decode.loop import DecodeConfig, generate

    prompt = prompt_of(tiny.model, 6)
    trace = trace_forward(tiny.model, prompt)
    assert all(not m._forward_hooks for m in tiny.model.modules())
    tokens = generate(tiny.model, prompt, DecodeConfig(2, ignore_eos=True)).tokens
    assert trace.next_tokens == (int(tokens[0, 1]),)  # the trace's decode step is the loop's second step


def test_symbols_evaluate_products():
    assert evaluate(("B", "S", "nKV*D"), {"B": 2, "S": 7, "nKV": 4, "D": 64}) == (2, 7, 256)


def test_trace_refuses_a_model_of_another_layout():
    from transformers import GPT2Config, GPT2LMHeadModel

    from inferlab.decode.prompts import Prompt

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).eval()
    prompt = Prompt(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(UsageError, match="trace supports Llama-style models"):
        trace_forward(model, prompt)


def test_cli_inspect_json_and_trace_table(capsys):
    assert main(["inspect", "tiny-random", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["parameters"] == 139_584 and report["config"]["kv_heads"] == 2
    assert main(["trace", "tiny-random", "--device", "cpu", "--prompt-length", "4"]) == 0
    out = capsys.readouterr().out
    assert "prefill: the whole prompt in one pass  (S=4, T=4)" in out
    assert "decode: one new token, reusing the KV cache  (S=1, T=5)" in out
    assert "(!)" not in out  # no observed shape disagrees with its symbols


def test_format_trace_marks_layers_not_shown(tiny):
    text = format_trace(trace_forward(tiny.model, prompt_of(tiny.model, 2)))
    assert "layer 0 shown; layer 1 repeats it" in text


def test_symbols_evaluate_sums_of_products_with_integers():
    values = {"nH": 4, "nKV": 2, "D": 16, "I": 128}
    assert evaluate(("nH*D+2*nKV*D", "2*I"), values) == (4 * 16 + 2 * 2 * 16, 256)


def test_fast_trace_records_the_engine_step_kernel_by_kernel(tiny):
    from inferlab.look.fast_trace import mismatches as fast_mismatches
    from inferlab.look.fast_trace import trace_fast_decode

    trace = trace_fast_decode(tiny.model, prompt_of(tiny.model, 5, batch=2))
    layer_roles = ["[q; k; v] projection", "attention", "o projection", "[gate; up] projection", "down projection"]
    assert [c.role for c in trace.calls] == layer_roles * 2 + ["LM head", "next token"]
    assert [c.layer for c in trace.calls] == [0] * 5 + [1] * 5 + [None, None]
    assert fast_mismatches(trace) == []
    attention = trace.calls[1]
    assert attention.reads == (2, 2, 6, 16)  # B, nKV, T = prompt + the new token, D
    assert attention.output == (2, 64)
    assert trace.calls[3].reads == (256, 64) and trace.calls[3].output == (2, 128)  # [gate; up] read once
    assert "RMSNorm" in trace.calls[0].fused and "residual" in trace.calls[2].fused
    # the fast step computes the transformers model's function (fp32: to rounding)
    assert trace.next_tokens == trace.reference_next_tokens
    assert trace.max_abs_logit_diff < 1e-5


def test_fast_trace_next_token_is_the_fast_engines_second_token(tiny):
    from inferlab.decode.loop import DecodeConfig
    from inferlab.decode.engines import make_engine
    from inferlab.look.fast_trace import trace_fast_decode
    from inferlab.measure.clocks import clock_for

    prompt = prompt_of(tiny.model, 6)
    engine = make_engine("fast-nocompile", tiny.model)
    config = DecodeConfig(2, ignore_eos=True)
    engine.prepare(prompt, config)
    tokens = engine.run(prompt, config, None, clock_for(CPU, 2))
    assert trace_fast_decode(tiny.model, prompt).next_tokens == (int(tokens[0, 1]),)


def test_fast_trace_refuses_padded_prompts(tiny):
    from inferlab.look.fast_trace import trace_fast_decode
    from inferlab.decode.prompts import Prompt

    prompt = Prompt(torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 1], [0, 1, 1]]))
    with pytest.raises(UsageError, match="equal length"):
        trace_fast_decode(tiny.model, prompt)


def test_cli_trace_of_the_fast_engine(capsys):
    assert main(["trace", "tiny-random", "--device", "cpu", "--engine", "fast", "--prompt-length", "4", "--all-layers"]) == 0
    out = capsys.readouterr().out
    assert "fast engine decode step (S=1, T=5): 12 kernels, 5 per layer" in out
    assert "(!)" not in out
    assert "(the same)" in out
