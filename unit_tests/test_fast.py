"""The fast engine: same logits as transformers, same greedy tokens as the eager loop, seeded
sampling that draws from the warped distribution; on the CPU without CUDA graphs."""

import pytest
import torch

from inferlab.decode.loop import DecodeConfig, generate
from inferlab.decode.engines import make_engine
from inferlab.errors import UsageError
from inferlab.fast.engine import FastEngine, FastLlama, FastOptions, cache_length, pick
from inferlab.decode.prompts import from_ids, random_prompt
from inferlab.decode.sampling import SamplingConfig
from inferlab.measure.clocks import HostClock

CPU = torch.device("cpu")
CPU_EAGER = FastOptions(compile=False, graphs=False)


def prompt_of(model, length, batch=1, seed=0):
    return random_prompt(model.config.vocab_size, length, batch, torch.Generator().manual_seed(seed), CPU)


@torch.inference_mode()
@pytest.mark.parametrize("prefill_flash", [True, False])  # the prefill's fused causal kernel, or matmul + softmax
def test_logits_equal_transformers_at_prefill_and_every_cached_step(tiny, prefill_flash):
    prompt = prompt_of(tiny.model, 7, batch=2)
    net = FastLlama(tiny.model, prefill_flash=prefill_flash)
    cache = net.new_cache(2, 7 + 5)
    ids = prompt.input_ids
    for step in range(5):
        positions = torch.arange(7 + step) if step == 0 else torch.tensor([7 + step - 1])
        ours = net(ids if step == 0 else ids[:, -1:], positions, cache, fresh=step == 0)[:, -1]
        theirs = tiny.model(input_ids=ids).logits[:, -1].float()  # full recompute, no cache
        # fp32, same math in another order (fused matrices, folded GQA): rounding-level differences.
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)
        ids = torch.cat([ids, theirs.argmax(-1, keepdim=True)], dim=1)


@torch.inference_mode()
def test_the_prefill_writes_the_same_cache_by_slice_as_by_index(tiny):
    prompt = prompt_of(tiny.model, 7, batch=2)
    results = []
    for slice_write in (False, True):
        net = FastLlama(tiny.model, slice_write=slice_write)
        cache = net.new_cache(2, 16)
        cache.k.fill_(3.0), cache.v.fill_(3.0)  # what the prefill must leave alone past its positions
        logits = net(prompt.input_ids, torch.arange(7), cache, fresh=True)
        results.append((logits, cache.k, cache.v))
    for ours, theirs in zip(*results):
        assert torch.equal(ours, theirs)
    assert bool((results[1][1][:, :, :, 7:] == 3.0).all()) and not bool((results[1][1][:, :, :, :7] == 3.0).any())


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_tokens_equal_the_eager_loop(tiny, batch):
    prompt = prompt_of(tiny.model, 9, batch)
    config = DecodeConfig(24, ignore_eos=True)
    eager = generate(tiny.model, prompt, config).tokens
    fast = FastEngine(tiny.model, CPU_EAGER).run(prompt, config, None, HostClock())
    assert torch.equal(fast, eager)


def test_one_token_is_stamped_per_step(tiny):
    prompt, config, clock = prompt_of(tiny.model, 4), DecodeConfig(6, ignore_eos=True), HostClock()
    FastEngine(tiny.model, CPU_EAGER).run(prompt, config, None, clock)
    assert len(clock.finish()) == 6


def test_going_back_to_a_prepared_shape_restores_it_instead_of_rebuilding(tiny, monkeypatch):
    engine = FastEngine(tiny.model, CPU_EAGER)
    short = (prompt_of(tiny.model, 5), DecodeConfig(4, ignore_eos=True))
    long_ = (prompt_of(tiny.model, 9), DecodeConfig(12, ignore_eos=True))
    first = engine.run(*short, None, HostClock())
    first_cache = engine.cache
    engine.run(*long_, None, HostClock())
    assert engine.cache is not first_cache
    built = []
    monkeypatch.setattr(FastLlama, "new_cache", lambda self, *shape: built.append(shape))
    again = engine.run(*short, None, HostClock())  # interleaved: back to the first shape
    assert built == []  # nothing rebuilt
    assert engine.cache is first_cache  # its own cache is back in place
    assert torch.equal(again, first) and torch.equal(again, generate(tiny.model, *short).tokens)
    assert [key[:3] for key in engine.prepared_shapes] == [(1, 5, 4), (1, 9, 12)]


@pytest.mark.parametrize("needed, max_context, expected", [
    (138, 2048, 256),    # prompt 128 + 10 tokens: the smallest bucket
    (228, 2048, 256),    # prompt 128 + 100 tokens: the same bucket, the same shapes
    (628, 2048, 1024),   # prompt 128 + 500
    (1012, 2048, 1024),  # prompt 512 + 500
    (1500, 1024, 1500),  # beyond the context (refused upstream): never smaller than needed
    (300, 512, 512),     # capped at the context
])
def test_the_cache_length_is_a_bucket_not_the_exact_request(needed, max_context, expected):
    assert cache_length(needed, max_context) == expected


def test_a_new_shape_compiles_nothing_and_builds_the_weights_once(tiny, monkeypatch):
    compiled, built = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, **options: compiled.append((getattr(fn, "__name__", type(fn).__name__), options)) or fn)
    init = FastLlama.__init__
    monkeypatch.setattr(FastLlama, "__init__", lambda self, *a, **k: built.append(1) or init(self, *a, **k))
    engine = FastEngine(tiny.model, FastOptions(compile=True, graphs=False, compile_mode="default"))
    shapes = [(5, 4), (9, 12), (5, 20)]
    for length, new_tokens in shapes:
        prompt, config = prompt_of(tiny.model, length), DecodeConfig(new_tokens, ignore_eos=True)
        assert torch.equal(engine.run(prompt, config, None, HostClock()), generate(tiny.model, prompt, config).tokens)
        assert engine.cache.length == 256  # one cache shape for all three requests
    assert [name for name, _ in compiled] == ["LayerStep", "_decode_body"]  # once per engine, not per shape
    assert compiled[0][1]["dynamic"] is True  # the prefill's layer: batch, prompt and cache length symbolic
    assert built == [1]


def test_a_static_prefill_is_compiled_for_the_shapes_it_sees(tiny, monkeypatch):
    """FastOptions(dynamic_prefill=False), the engine as it compiled before it prepared once per
    model (the trade-off's "before"): the prefill's function is compiled without dynamic shapes,
    so torch specializes, and recompiles, it for each new shape."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **options: compiled.append((getattr(fn, "__name__", type(fn).__name__), options)) or fn)
    for scope, name in (("layer", "LayerStep"), ("model", "FastLlama")):
        engine = FastEngine(tiny.model, FastOptions(compile=True, graphs=False, compile_mode="default",
                                                    dynamic_prefill=False, prefill_compile=scope))
        prompt, config = prompt_of(tiny.model, 5), DecodeConfig(4, ignore_eos=True)
        assert torch.equal(engine.run(prompt, config, None, HostClock()), generate(tiny.model, prompt, config).tokens)
        assert compiled[-2][0] == name and compiled[-2][1]["dynamic"] is False


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's CPU backend uses torch.jit internally
def test_a_second_shape_reuses_the_compiled_prefill_and_decode_step(tiny):
    from torch._dynamo.utils import counters

    engine = FastEngine(tiny.model, FastOptions(compile=True, graphs=False, compile_mode="default"))
    first = (prompt_of(tiny.model, 6), DecodeConfig(8, ignore_eos=True))
    second = (prompt_of(tiny.model, 11, seed=1), DecodeConfig(30, ignore_eos=True))  # another prompt and output length
    engine.run(*first, None, HostClock())
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # the prefill and the decode step
    tokens = engine.run(*second, None, HostClock())
    assert counters["stats"]["unique_graphs"] == graphs  # nothing recompiled
    assert torch.equal(tokens, generate(tiny.model, *second).tokens)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's CPU backend uses torch.jit internally
@pytest.mark.parametrize("prefill_compile", ["layer", "model"])
def test_the_prefill_compiles_once_across_cache_buckets_and_once_more_for_larger_batches(tiny, prefill_compile):
    """The decode step runs the Triton kernels (under the interpreter here) and greedy decoding
    ends in the greedy kernel, so every graph counted is the prefill's (one layer, or all)."""
    from torch._dynamo.utils import counters

    engine = FastEngine(tiny.model, FastOptions(compile=True, graphs=False, triton=True, prefill_compile=prefill_compile))
    head_dim = tiny.model.config.hidden_size // tiny.model.config.num_attention_heads
    # Few new tokens: the prefill's graphs do not depend on them (only the cache bucket, prompt
    # and batch reach it), and each decode step is the Triton kernels under the interpreter.
    shapes = [(1, head_dim, 3),  # a prompt as long as the head dimension: no guard may tie the two
              (1, 254, 3),        # a new cache bucket (257 positions: 512)
              (1, 7, 2),
              (3, 9, 2),          # batch 3: compiled once more (size 1 is specialized)
              (2, 20, 2)]
    graphs = []
    for batch, length, new_tokens in shapes:
        prompt, config = prompt_of(tiny.model, length, batch, seed=length), DecodeConfig(new_tokens, ignore_eos=True)
        tokens = engine.run(prompt, config, None, HostClock())
        assert torch.equal(tokens, generate(tiny.model, prompt, config).tokens)
        graphs.append(counters["stats"]["unique_graphs"])
    assert [key[:3] for key in engine.prepared_shapes] == shapes
    assert engine.cache.length == 256 and engine._shapes[engine.prepared_shapes[1]]["cache"].length == 512
    first = graphs[0]
    assert graphs == [first, first, first, first + 1, first + 1]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's CPU backend uses torch.jit internally
def test_with_the_kernels_a_sampled_step_ends_in_a_compiled_function_that_draws_the_same_tokens(tiny, monkeypatch):
    pytest.importorskip("triton", reason="the decode step's kernels need Triton (its interpreter on the CPU)")
    compiled = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: compiled.append(getattr(fn, "__name__", type(fn).__name__))
                        or real_compile(fn, **options))
    # 4 rows: the decode step's GEMVs in the tensor-core kernel, a fraction of the interpreter's
    # time for one program per row
    prompt = prompt_of(tiny.model, 5, batch=4)
    config = DecodeConfig(5, SamplingConfig(greedy=False, temperature=0.7, top_k=50, top_p=0.9), ignore_eos=True)

    def draw(compile_):
        engine = FastEngine(tiny.model, FastOptions(compile=compile_, graphs=False, triton=True))
        return engine.run(prompt, config, torch.Generator().manual_seed(7), HostClock())
    assert torch.equal(draw(True), draw(False))
    assert compiled == ["LayerStep", "sample_step"]


def test_seeded_sampling_repeats_with_the_seed_and_changes_without_it(tiny):
    prompt = prompt_of(tiny.model, 5)
    config = DecodeConfig(16, SamplingConfig(greedy=False, temperature=1.5, top_k=100, top_p=0.95), ignore_eos=True)
    engine = FastEngine(tiny.model, CPU_EAGER)

    def draw(seed):
        return engine.run(prompt, config, torch.Generator().manual_seed(seed), HostClock())

    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))


def test_the_exponential_race_draws_from_the_warped_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampling = SamplingConfig(greedy=False, top_k=3)  # top-k drops the 0.05 token; the rest renormalise
    generator = torch.Generator().manual_seed(0)
    draws = 40_000
    picks = torch.stack([pick(logits, sampling, torch.rand(1, 4, generator=generator)) for _ in range(draws)])
    frequency = torch.bincount(picks.flatten(), minlength=4).double() / draws
    expected = torch.tensor([0.5, 0.3, 0.15, 0.0], dtype=torch.double) / 0.95
    # 4 standard errors of a frequency near 0.5 with 40k draws is 0.01
    torch.testing.assert_close(frequency, expected, atol=0.01, rtol=0)


def test_greedy_pick_is_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert pick(logits, SamplingConfig(), None).tolist() == [1, 0]


def test_an_unknown_prefill_attention_or_compile_is_refused_with_the_choices():
    with pytest.raises(UsageError, match="'flash' or 'matmul'"):
        FastOptions(prefill_attention="sdpa")
    with pytest.raises(UsageError, match="'layer' or 'model'"):
        FastOptions(prefill_compile="graph")
    with pytest.raises(UsageError, match="'slice' or 'index'"):
        FastOptions(prefill_cache_write="scatter")


def test_padded_prompts_and_cpu_graphs_are_refused_with_a_reason(tiny):
    with pytest.raises(UsageError, match="CUDA graphs need a CUDA device"):
        FastEngine(tiny.model, FastOptions(compile=False, graphs=True))
    padded = from_ids([[5, 6, 7], [8]], 0, CPU)
    with pytest.raises(UsageError, match="prompts of equal length"):
        FastEngine(tiny.model, CPU_EAGER).run(padded, DecodeConfig(2, ignore_eos=True), None, HostClock())


def test_non_llama_models_are_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(UsageError, match="supports Llama-architecture models, not 'gpt2'"):
        FastEngine(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)))


def test_engine_names_choose_compilation(tiny):
    assert make_engine("fast-nocompile", tiny.model).options.compile is False
    assert make_engine("fast", tiny.model).options.compile is False  # CPU: compile only on CUDA by default
    assert make_engine("fast", tiny.model).name == "fast"


def test_fast_split_runs_the_split_kernels_where_triton_is_and_is_plain_fast_elsewhere(tiny, monkeypatch):
    from inferlab.fast import engine as fast_engine

    split = make_engine("fast-split", tiny.model)
    assert split.name == "fast-split"
    if fast_engine.triton_available():
        from inferlab.fast.kernels import SPLIT_POLICY

        assert split.options.launch is SPLIT_POLICY and SPLIT_POLICY.attention == "split"
        assert SPLIT_POLICY.rows_target_programs > 0
    monkeypatch.setattr(fast_engine, "triton_available", lambda: False)
    assert make_engine("fast-split", tiny.model).options.launch is None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor's CPU backend uses torch.jit internally
def test_compiled_on_cpu_gives_the_eager_loops_tokens(tiny):
    prompt, config = prompt_of(tiny.model, 6), DecodeConfig(8, ignore_eos=True)
    compiled = FastEngine(tiny.model, FastOptions(compile=True, graphs=False, compile_mode="default"))
    assert torch.equal(compiled.run(prompt, config, None, HostClock()), generate(tiny.model, prompt, config).tokens)


@pytest.mark.gpu
def test_cuda_graph_replay_gives_the_eager_loops_tokens():
    from inferlab.model.registry import load_model
    from inferlab.measure.clocks import CudaEventClock

    device = torch.device("cuda")
    loaded = load_model("tiny-random", device, torch.float32)
    prompt = random_prompt(512, 16, 2, torch.Generator().manual_seed(0), device)
    config = DecodeConfig(16, ignore_eos=True)
    engine = FastEngine(loaded.model, FastOptions(compile=False, graphs=True))
    fast = engine.run(prompt, config, None, CudaEventClock(device, 16))
    assert torch.equal(fast, generate(loaded.model, prompt, config).tokens)


@pytest.mark.gpu
def test_on_cuda_a_second_shape_reuses_the_compiled_prefill_and_captures_its_own_graphs():
    from torch._dynamo.utils import counters

    from inferlab.model.registry import load_model
    from inferlab.measure.clocks import CudaEventClock

    device = torch.device("cuda")
    loaded = load_model("tiny-random", device, torch.float32)
    engine = FastEngine(loaded.model)  # the defaults on CUDA: Triton decode step, compiled prefill, graphs
    requests = [(random_prompt(512, length, 1, torch.Generator().manual_seed(length), device),
                 DecodeConfig(new, ignore_eos=True)) for length, new in ((16, 8), (40, 30), (16, 100))]
    outputs, graphs = [], []
    for prompt, config in requests:
        outputs.append(engine.run(prompt, config, None, CudaEventClock(device, config.max_new_tokens)))
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs[1:] == [graphs[0]] * 2  # the prefill compiled once
    for (prompt, config), tokens in zip(requests, outputs):
        assert torch.equal(tokens, generate(loaded.model, prompt, config).tokens)


def test_compile_options_extend_the_mode_without_touching_global_inductor_settings():
    import torch._inductor.config as inductor_config

    from inferlab.fast.engine import compile_options

    before = inductor_config.coordinate_descent_tuning
    options = compile_options(FastOptions(compile_mode="max-autotune-no-cudagraphs", coordinate_descent=False))
    assert options["max_autotune"] is True and options["coordinate_descent_tuning"] is False
    assert compile_options(FastOptions(compile_mode="default")) == {"coordinate_descent_tuning": True}
    assert inductor_config.coordinate_descent_tuning == before
