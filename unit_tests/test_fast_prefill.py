"""How the fast engine's prefill ends and writes its cache: each option gives the default's tokens,
position and cache. On a CPU the Triton kernels run under Triton's interpreter."""
import pytest
import torch

from inferlab.decode.loop import DecodeConfig, generate
from inferlab.decode.prompts import random_prompt
from inferlab.decode.sampling import SamplingConfig
from inferlab.fast.engine import FastEngine, FastOptions
from inferlab.measure.clocks import HostClock

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_on_device(tiny):
    from inferlab.model.registry import load_model

    return tiny.model if DEVICE.type == "cpu" else load_model("tiny-random", DEVICE, torch.float32).model


@pytest.mark.parametrize("batch", [1, 2])
def test_a_greedy_prefill_ending_in_the_step_kernels_gives_the_eager_loops_tokens(tiny, batch):
    pytest.importorskip("triton", reason="the step kernels need Triton (its interpreter on the CPU)")
    model = model_on_device(tiny)
    prompt = random_prompt(model.config.vocab_size, 6, batch, torch.Generator().manual_seed(3), DEVICE)
    config = DecodeConfig(5, ignore_eos=True)
    graphs = DEVICE.type == "cuda"
    engines = [FastEngine(model, FastOptions(compile=False, graphs=graphs, triton=True, prefill_head=head,
                                             prefill_cache_write=write))
               for head, write in (("torch", "index"), ("kernels", "slice"))]
    runs = [engine.run(prompt, config, None, HostClock()) for engine in engines]
    assert [engine._kernel_head for engine in engines] == [False, True]
    assert torch.equal(runs[1], generate(model, prompt, config).tokens) and torch.equal(runs[0], runs[1])
    assert int(engines[1].position) == int(engines[0].position) == 6 + 5 - 1  # the prompt, then 4 decode steps
    assert torch.equal(engines[1].cache.k, engines[0].cache.k) and torch.equal(engines[1].hidden, engines[0].hidden)


def test_a_sampled_prefill_keeps_the_torch_head(tiny):
    pytest.importorskip("triton", reason="the step kernels need Triton (its interpreter on the CPU)")
    model = model_on_device(tiny)
    engine = FastEngine(model, FastOptions(compile=False, graphs=DEVICE.type == "cuda", triton=True, prefill_head="kernels"))
    sampled = DecodeConfig(2, sampling=SamplingConfig(greedy=False, temperature=0.7), ignore_eos=True)
    engine.prepare(random_prompt(model.config.vocab_size, 4, 1, torch.Generator().manual_seed(1), DEVICE), sampled)
    assert not engine._kernel_head


def test_an_unknown_prefill_head_is_refused_with_the_choices():
    from inferlab.errors import UsageError

    with pytest.raises(UsageError, match="'kernels' or 'torch'"):
        FastOptions(prefill_head="fused")
