"""perf_tests/scripts/kernel_configs.py's arguments for the decode steps it times: read or refused in one line."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "perf_tests" / "scripts" / "kernel_configs.py"


@pytest.fixture(scope="module")
def kernel_configs(perf_script):
    return perf_script("kernel_configs")


@pytest.mark.parametrize("argument, message", [
    ("--step-shapes=128", "is not PROMPTxNEW"), ("--step-shapes=0x128", "is not PROMPTxNEW"),
    ("--step-shapes=ax1", "is not PROMPTxNEW"), ("--step-variants=head/flash/model2", "unknown"),
    ("--probe-rows=1", "of 2 rows or more"), ("--probe-rows=4,x", "of 2 rows or more"),
])
def test_a_bad_step_shape_or_variant_is_refused_in_one_line_before_any_device_work(kernel_configs, monkeypatch, capsys,
                                                                                   argument, message):
    """The script's `main` in this process: argparse's refusal, exit status 2, before anything else
    runs (any other exception would end the test here); the script as a process below."""
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--out", "unused", "--attention-variants", argument])
    with pytest.raises(SystemExit) as stopped:
        kernel_configs.main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_script_run_as_a_process_refuses_a_bad_argument_in_one_line():
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", "unused", "--attention-variants", "--step-shapes=ax1"],
                          capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=120)
    assert done.returncode == 2
    assert "is not PROMPTxNEW" in done.stderr and "Traceback" not in done.stderr


def test_the_step_shapes_and_variants_are_read_in_order(kernel_configs):
    assert kernel_configs.step_shapes("128x128,1920x128") == [(128, 128), (1920, 128)]
    assert kernel_configs.step_variants("head/matmul/model,ranges128/flash/layer") == [
        ("head", "matmul", "model"), ("ranges128", "flash", "layer")]
    # "head" is the kernel without ranges, as the engine ran before ranges became the default
    assert kernel_configs.STEP_ATTENTION["head"].head_range == 0
    # "ranges128": the default's ranges at every cache length (the default reads a cache of up to
    # 256 positions in one tile)
    assert kernel_configs.STEP_ATTENTION["ranges128"] == kernel_configs.ops.LaunchPolicy(head_whole_cache=0)
    # "-static": the prefill compiled for each shape, as before the engine prepared once per model
    assert kernel_configs.step_variants("head/matmul/model-static") == [("head", "matmul", "model-static")]
    assert kernel_configs.compile_scope("model-static") == ("model", True)
    assert kernel_configs.compile_scope("layer") == ("layer", False)


def test_the_probed_matrices_come_from_the_models_config(kernel_configs):
    from types import SimpleNamespace

    from inferlab.model.registry import RANDOM_CONFIGS

    tinyllama = kernel_configs.decode_matrices(SimpleNamespace(**RANDOM_CONFIGS["tinyllama-1.1b-random"]))
    assert tinyllama == [("gate_up", 5632, 2048, "gated"), ("down", 2048, 5632, "residual"),
                         ("lm_head", 32000, 2048, "logits"), ("qkv", 2560, 2048, "norm"), ("o", 2048, 2048, "residual")]
    # SmolLM2-135M: hidden 576, 9 heads and 3 KV heads of 64, MLP 1536, vocabulary 49152
    smollm2 = SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                              vocab_size=49152)
    assert kernel_configs.decode_matrices(smollm2) == [
        ("gate_up", 1536, 576, "gated"), ("down", 576, 1536, "residual"), ("lm_head", 49152, 576, "logits"),
        ("qkv", 960, 576, "norm"), ("o", 576, 576, "residual")]


def test_a_tile_wider_than_k_is_tried_only_where_it_holds_the_row_whole(kernel_configs):
    # SmolLM2: K = 576 takes one tile of 1024 (the row loaded before the wait), not 2048; K = 1536 one of 2048
    assert kernel_configs.tile_fits(512, 576) and kernel_configs.tile_fits(1024, 576)
    assert not kernel_configs.tile_fits(2048, 576)
    assert kernel_configs.tile_fits(2048, 1536) and kernel_configs.tile_fits(2048, 2048)
    assert not kernel_configs.tile_fits(4096, 2048)


def test_each_batch_size_is_probed_with_the_kernels_that_can_serve_it(kernel_configs):
    assert kernel_configs.row_counts("4,16") == [4, 16]
    ops = kernel_configs.ops
    four, sixteen = kernel_configs.rows_variants(4, 2560, 2048, False), kernel_configs.rows_variants(16, 2560, 2048, False)
    assert list(four)[:7] == ["per-row", "cuda-core", "cuda-core, one-row shape", "rowwise", "tensor",
                              "tensor prefetch", "tensor split-K 264"]
    assert not any(label.startswith("cuda-core") for label in sixteen)  # beyond the CUDA-core kernel's 8 rows
    assert four["cuda-core, one-row shape"].config == ops.gemv_config(2560, 2048, False)
    assert four["rowwise"] == ops.RowsLaunch("rowwise") and "rowwise" not in sixteen  # beyond its 8 rows
    assert four["tensor prefetch"].prefetch and four["tensor split-K 264"].target_programs == 264
    assert four["tensor"] == ops.RowsLaunch("tensor") and four["per-row"].kernel == "row"
    # each probe's policy runs its launch at that many rows, for that matrix only, from 2 rows
    two, one = kernel_configs.rows_variants(2, 2560, 2048, False), kernel_configs.rows_variants(1, 2560, 2048, False)
    # the stream-K kernel in each of its units at 1 and 2 programs per SM (4 SMs without CUDA), and prefetching
    assert four["stream n64 k128 2/SM"] == ops.RowsLaunch("stream", ops.STREAM_GEMV, target_programs=2 * 4)
    assert four["stream prefetch"].prefetch and four["stream n32 k256 1/SM"].config.block_n == 32
    for rows, variants in ((1, one), (2, two), (4, four), (16, sixteen)):
        for label, launch in variants.items():
            policy = kernel_configs.rows_policy(2560, 2048, False, rows, launch)
            assert policy.rows_launch(2560, 2048, False, rows) == launch, label
            assert policy.rows_launch(2048, 2048, False, rows) != launch, label


def test_each_model_s_measured_launch_shapes_key_exactly_the_matrices_its_decode_step_multiplies(kernel_configs):
    """`MEASURED_GEMV` is keyed by (N, K, gated) as the engine calls `gemv`: TinyLlama's entries are
    the five matrices of its config, SmolLM2-135M's the five of its own (hidden 576, 9 heads of 64,
    3 KV heads, MLP 1536, vocabulary 49,152, as in the embedded GGUF); a key that missed would
    silently run the default shape."""
    from transformers import LlamaConfig

    from inferlab.model.registry import TINYLLAMA_CONFIG

    ops = kernel_configs.ops
    smollm2 = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                          vocab_size=49152, num_hidden_layers=30)
    for config, measured in ((LlamaConfig(**TINYLLAMA_CONFIG), ops.TINYLLAMA_GEMV), (smollm2, ops.SMOLLM2_GEMV)):
        keys = {(n, k, kind == "gated") for _, n, k, kind in kernel_configs.decode_matrices(config)}
        assert keys == set(measured)
    assert ops.MEASURED_GEMV == {**ops.TINYLLAMA_GEMV, **ops.SMOLLM2_GEMV}
