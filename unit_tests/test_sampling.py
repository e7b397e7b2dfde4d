"""Each sampler on hand-built logits: exact keep/remove sets."""

import math

import pytest
import torch

from inferlab.decode.sampling import SamplingConfig, apply_temperature, apply_top_k, apply_top_p, select, warp

NEG_INF = float("-inf")


def kept(logits: torch.Tensor) -> list[list[int]]:
    return [[i for i, v in enumerate(row.tolist()) if v != NEG_INF] for row in logits]


def test_greedy_is_argmax_of_each_row():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9], [5.0, 0.0, 0.0, 4.0]])
    assert select(logits, SamplingConfig(greedy=True), None).tolist() == [1, 0]


def test_temperature_divides_logits():
    logits = torch.tensor([[2.0, -4.0, 1.0]])
    assert apply_temperature(logits, 0.5).tolist() == [[4.0, -8.0, 2.0]]
    assert apply_temperature(logits, 2.0).tolist() == [[1.0, -2.0, 0.5]]


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0, 1.0]])
    assert kept(apply_top_k(logits, 2)) == [[1, 3]]
    assert apply_top_k(logits, 2)[0, 1].item() == 3.0  # kept values are unchanged


def test_top_k_keeps_ties_at_the_kth_value_as_generate_does():
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0]])
    assert kept(apply_top_k(logits, 2)) == [[1, 2, 3]]


def test_top_k_larger_than_vocab_keeps_everything():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert kept(apply_top_k(logits, 10)) == [[0, 1, 2]]


def test_top_p_keeps_the_minimal_nucleus():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    assert kept(apply_top_p(logits, 0.8)) == [[0, 1]]  # 0.5 + 0.3 reaches 0.8
    assert kept(apply_top_p(logits, 0.81)) == [[0, 1, 2]]
    assert kept(apply_top_p(logits, 0.5)) == [[0]]


def test_top_p_always_keeps_the_most_probable_token():
    logits = torch.tensor([[10.0, 0.0, 0.0]])
    assert kept(apply_top_p(logits, 1e-6)) == [[0]]


def test_top_p_one_keeps_everything():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert kept(warp(logits, SamplingConfig(greedy=False, top_p=1.0))) == [[0, 1, 2]]


def test_warpers_do_not_modify_their_input():
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0]])
    before = logits.clone()
    apply_top_k(logits, 1)
    apply_top_p(logits, 0.5)
    apply_temperature(logits, 0.3)
    assert torch.equal(logits, before)


def test_warp_order_is_temperature_then_top_k_then_top_p():
    # Temperature 0.5 sharpens [2, 1, 0, -1] to probabilities (0.865, 0.117, 0.016, 0.002), so
    # top-p 0.8 keeps one token; on the unsharpened (0.644, 0.237, 0.087, 0.032) it keeps two.
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    config = SamplingConfig(greedy=False, temperature=0.5, top_k=3, top_p=0.8)
    out = warp(logits, config)
    assert kept(out) == [[0]]
    assert out[0, 0].item() == 4.0
    assert kept(apply_top_p(logits, 0.8)) == [[0, 1]]


def test_sampling_with_a_seeded_generator_is_reproducible():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    config = SamplingConfig(greedy=False, temperature=0.9, top_k=10)
    first = select(logits, config, torch.Generator().manual_seed(7))
    second = select(logits, config, torch.Generator().manual_seed(7))
    assert torch.equal(first, second)


def test_sampling_never_picks_a_filtered_token():
    logits = torch.tensor([[0.0, 0.0, 5.0, 5.0, 0.0]]).repeat(64, 1)
    ids = select(logits, SamplingConfig(greedy=False, top_k=2), torch.Generator().manual_seed(0))
    assert set(ids.tolist()) <= {2, 3}
    assert set(ids.tolist()) == {2, 3}  # both survivors are drawn in 64 tries (p of missing one: 2**-63)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=0.0), "`temperature` has to be a strictly positive float, but is 0.0"),
        (dict(temperature=-1.0), "`temperature` has to be a strictly positive float, but is -1.0"),
        (dict(temperature=math.nan), "`temperature` has to be a strictly positive float"),
        (dict(top_k=0), "`top_k` has to be a strictly positive integer, but is 0"),
        (dict(top_k=2.5), "`top_k` has to be a strictly positive integer, but is 2.5"),
        (dict(top_p=0.0), "`top_p` has to be a float > 0 and <= 1, but is 0.0"),
        (dict(top_p=1.5), "`top_p` has to be a float > 0 and <= 1, but is 1.5"),
    ],
)
def test_invalid_parameters_raise_a_clear_value_error(kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        SamplingConfig(greedy=False, **kwargs)
