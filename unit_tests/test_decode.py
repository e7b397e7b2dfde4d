"""The manual decode loop: cache shapes, cache correctness, and equality with model.generate."""

import pytest
import torch

from inferlab.decode import kvcache
from inferlab.decode.loop import DecodeConfig, generate, generate_steps
from inferlab.decode.prompts import from_ids, from_texts, random_prompt
from inferlab.decode.sampling import SamplingConfig

CPU = torch.device("cpu")
SAMPLERS = {
    "temperature": dict(temperature=0.7),
    "top_k": dict(top_k=20),
    "top_p": dict(top_p=0.9),
    "all_three": dict(temperature=0.7, top_k=20, top_p=0.9),
}


def hf_generate(model, prompt, new_tokens, **kwargs):
    # eos_token_id=None: fixed length without generate's min-length EOS masking, like ignore_eos.
    return model.generate(
        input_ids=prompt.input_ids,
        attention_mask=prompt.attention_mask,
        max_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        **kwargs,
    )


def ragged_prompt(vocab: int, device=CPU):
    rows = [[5, 17, 33, 8, 91, 4, 12], [7, 300, 41], [250, 11, 9, 60, 3]]
    return from_ids([[t % vocab for t in row] for row in rows], pad_token_id=0, device=device)


def test_logits_and_cache_have_the_expected_shape_at_every_step(tiny):
    config = tiny.model.config
    prompt = ragged_prompt(config.vocab_size)
    steps = list(generate_steps(tiny.model, prompt, DecodeConfig(max_new_tokens=6, ignore_eos=True)))
    head_dim = config.hidden_size // config.num_attention_heads
    assert [s.index for s in steps] == list(range(6))
    for step in steps:
        assert step.tokens.shape == (3,)
        assert step.logits.shape == (3, config.vocab_size) and step.logits.dtype == torch.float32
        assert step.seq_len == prompt.length + step.index
    # The cache object is shared: after the loop it holds prompt + 5 decoded positions.
    shapes = kvcache.layer_kv_shapes(steps[-1].cache)
    expected = (3, config.num_key_value_heads, prompt.length + 5, head_dim)
    assert shapes == [(expected, expected)] * config.num_hidden_layers


def test_cache_grows_by_one_position_per_step(tiny):
    prompt = ragged_prompt(tiny.model.config.vocab_size)
    lengths = [kvcache.cached_length(s.cache) for s in generate_steps(tiny.model, prompt, DecodeConfig(4, ignore_eos=True))]
    assert lengths == [prompt.length, prompt.length + 1, prompt.length + 2, prompt.length + 3]


@pytest.mark.parametrize("batch", [1, 3])
def test_incremental_logits_equal_a_full_recompute(tiny, batch):
    # fp32 on CPU: the cached and uncached paths differ only by summation order (atol 1e-5).
    prompt = ragged_prompt(tiny.model.config.vocab_size)
    prompt = type(prompt)(prompt.input_ids[:batch], prompt.attention_mask[:batch])
    steps = list(generate_steps(tiny.model, prompt, DecodeConfig(max_new_tokens=8, ignore_eos=True)))
    generated = torch.stack([s.tokens for s in steps], dim=1)
    for step in steps:
        ids = torch.cat([prompt.input_ids, generated[:, : step.index]], dim=1)
        mask = torch.cat([prompt.attention_mask, torch.ones_like(generated[:, : step.index])], dim=1)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        with torch.no_grad():
            full = tiny.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        torch.testing.assert_close(step.logits, full.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_tokens_equal_generate_on_tiny_random(tiny, batch):
    prompt = ragged_prompt(tiny.model.config.vocab_size)
    prompt = type(prompt)(prompt.input_ids[:batch], prompt.attention_mask[:batch])
    ours = generate(tiny.model, prompt, DecodeConfig(max_new_tokens=24, ignore_eos=True))
    theirs = hf_generate(tiny.model, prompt, 24, do_sample=False)
    assert torch.equal(ours.sequences(), theirs)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_seeded_sampling_equals_generate_under_the_same_seed(tiny, name):
    prompt = ragged_prompt(tiny.model.config.vocab_size)
    kwargs = SAMPLERS[name]
    torch.manual_seed(1234)
    ours = generate(tiny.model, prompt, DecodeConfig(16, SamplingConfig(greedy=False, **kwargs), ignore_eos=True))
    torch.manual_seed(1234)
    theirs = hf_generate(tiny.model, prompt, 16, do_sample=True, **{"top_k": 0, **kwargs})
    assert torch.equal(ours.sequences(), theirs)


def test_seeded_generator_gives_the_same_tokens_without_touching_the_global_rng(tiny):
    prompt = ragged_prompt(tiny.model.config.vocab_size)
    config = DecodeConfig(12, SamplingConfig(greedy=False, top_p=0.95), ignore_eos=True)
    state = torch.get_rng_state()
    first = generate(tiny.model, prompt, config, torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), state)
    second = generate(tiny.model, prompt, config, torch.Generator().manual_seed(3))
    assert torch.equal(first.tokens, second.tokens)


def test_stops_when_every_row_has_produced_eos(tiny):
    prompt = ragged_prompt(tiny.model.config.vocab_size)
    free = generate(tiny.model, prompt, DecodeConfig(max_new_tokens=10, ignore_eos=True)).tokens
    # Declare the tokens greedy decoding produces at step 2 to be EOS: every row stops there.
    eos = tuple(sorted(set(free[:, 2].tolist())))
    stopped = generate(tiny.model, prompt, DecodeConfig(max_new_tokens=10, eos_token_ids=eos, pad_token_id=0))
    assert stopped.num_new_tokens <= 3
    first_eos = [next(i for i, t in enumerate(row) if t in eos) for row in free.tolist()]
    for row, stop, full in zip(stopped.tokens.tolist(), first_eos, free.tolist()):
        assert row[: stop + 1] == full[: stop + 1]
        assert all(t == 0 for t in row[stop + 1 :])  # finished rows are padded


def test_ignore_eos_generates_exactly_max_new_tokens(tiny):
    prompt = ragged_prompt(tiny.model.config.vocab_size)
    free = generate(tiny.model, prompt, DecodeConfig(max_new_tokens=3, ignore_eos=True)).tokens
    eos = tuple(set(free[:, 0].tolist()))
    out = generate(tiny.model, prompt, DecodeConfig(max_new_tokens=9, ignore_eos=True, eos_token_ids=eos))
    assert out.num_new_tokens == 9


def test_on_step_hook_sees_every_step_in_order(tiny):
    prompt = random_prompt(tiny.model.config.vocab_size, 5, 1, torch.Generator().manual_seed(0), CPU)
    seen = []
    out = generate(tiny.model, prompt, DecodeConfig(5, ignore_eos=True), on_step=lambda s: seen.append(s.tokens.clone()))
    assert torch.equal(torch.stack(seen, dim=1), out.tokens)


def test_decode_config_rejects_a_non_positive_length():
    with pytest.raises(ValueError, match="`max_new_tokens` has to be a positive integer, but is 0"):
        DecodeConfig(max_new_tokens=0)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_tokens_equal_generate_on_smollm2(smollm2, batch):
    texts = ["What is the capital of France?", "Name three colors of the rainbow."][:batch]
    prompt = from_texts(smollm2.tokenizer, texts, CPU)
    ours = generate(smollm2.model, prompt, DecodeConfig(20, eos_token_ids=(2,), pad_token_id=smollm2.tokenizer.pad_token_id))
    theirs = smollm2.model.generate(
        input_ids=prompt.input_ids, attention_mask=prompt.attention_mask, max_new_tokens=20, do_sample=False
    )
    assert torch.equal(ours.sequences(), theirs)
    if batch == 1:
        assert smollm2.tokenizer.decode(ours.tokens[0], skip_special_tokens=True) == "The capital of France is Paris."


@pytest.mark.slow
def test_seeded_sampling_equals_generate_on_smollm2(smollm2):
    prompt = from_texts(smollm2.tokenizer, ["Write a haiku about the sea.", "Hi"], CPU)
    kwargs = SAMPLERS["all_three"]
    torch.manual_seed(99)
    ours = generate(smollm2.model, prompt, DecodeConfig(12, SamplingConfig(greedy=False, **kwargs), ignore_eos=True))
    torch.manual_seed(99)
    theirs = hf_generate(smollm2.model, prompt, 12, do_sample=True, **kwargs)
    assert torch.equal(ours.sequences(), theirs)


@pytest.mark.gpu
def test_bf16_greedy_and_sampling_equal_generate_on_tinyllama_random_gpu(cuda_device):
    from inferlab.model.registry import load_model

    lm = load_model("tinyllama-1.1b-random", cuda_device, torch.bfloat16)
    prompt = random_prompt(32000, 64, 2, torch.Generator().manual_seed(0), cuda_device)
    ours = generate(lm.model, prompt, DecodeConfig(32, ignore_eos=True))
    assert torch.equal(ours.sequences(), hf_generate(lm.model, prompt, 32, do_sample=False))
    for name, kwargs in SAMPLERS.items():
        torch.manual_seed(7)
        ours = generate(lm.model, prompt, DecodeConfig(32, SamplingConfig(greedy=False, **kwargs), ignore_eos=True))
        torch.manual_seed(7)
        theirs = hf_generate(lm.model, prompt, 32, do_sample=True, **{"top_k": 0, **kwargs})
        assert torch.equal(ours.sequences(), theirs), name
