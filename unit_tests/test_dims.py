"""Shape facts derived once from a config: head dim, KV heads, KV bytes; EOS ids; error first lines."""

from types import SimpleNamespace

import pytest
import torch

from inferlab.decode.loop import eos_token_ids
from inferlab.errors import UsageError, first_line
from inferlab.model import dims


def llama(**overrides):
    fields = dict(num_hidden_layers=22, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4)
    return SimpleNamespace(**{**fields, **overrides})


def test_head_dim_is_hidden_over_heads_unless_the_config_sets_it():
    assert dims.head_dim(llama()) == 64
    assert dims.head_dim(llama(head_dim=128)) == 128
    assert dims.head_dim(llama(head_dim=None)) == 64


def test_a_config_without_kv_heads_has_one_per_query_head():
    assert dims.kv_heads(llama()) == 4
    assert dims.kv_heads(SimpleNamespace(num_attention_heads=12)) == 12


def test_tinyllama_kv_bytes_per_position_match_its_published_figure():
    # FACTS: 2 x 22 layers x 4 heads x 64 x 2 bytes = 22.5 KB per cached position in bf16
    assert dims.kv_bytes_per_position(llama(), torch.bfloat16) == 2 * 22 * 4 * 64 * 2 == 22528
    assert dims.kv_bytes_per_position(llama(), torch.float32) == 45056


@pytest.mark.parametrize("eos, expected", [(2, (2,)), ([2, 7], (2, 7)), (None, ())])
def test_eos_ids_come_as_a_tuple_whatever_the_generation_config_holds(eos, expected):
    assert eos_token_ids(SimpleNamespace(eos_token_id=eos)) == expected


def test_first_line_of_an_error_or_its_type_when_empty():
    assert first_line(RuntimeError("out of memory\n  at frame 3")) == "out of memory"
    assert first_line(MemoryError()) == "MemoryError"


def test_usage_errors_are_value_errors():
    with pytest.raises(ValueError):
        raise UsageError("--runs must be positive, got 0")
