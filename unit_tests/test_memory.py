"""Memory figures: weights counted once, KV bytes from the config, RSS units, every result carries them."""

import json
from types import SimpleNamespace

import torch

from inferlab.look.tables import format_result
from inferlab.measure import memory
from inferlab.measure.bench import BenchConfig, result_from_dict, run_benchmark


class Tied(torch.nn.Module):
    """A 4x3 fp32 weight reachable twice (tied) and a 5-element fp16 buffer: 48 + 10 bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(4, 3, bias=False)
        self.head = self.embed
        self.register_buffer("scale", torch.zeros(5, dtype=torch.float16))


def test_weight_bytes_count_tied_weights_once_and_buffers():
    assert memory.weight_bytes(Tied()) == 4 * 3 * 4 + 5 * 2


def test_kv_cache_bytes_at_the_final_length():
    model = torch.nn.Linear(2, 2, dtype=torch.bfloat16)
    model.config = SimpleNamespace(num_hidden_layers=3, num_key_value_heads=2, num_attention_heads=4, hidden_size=32)
    # K and V x 3 layers x 2 KV heads x head dim 8 x 2 bytes = 192 bytes per position; 4 sequences of 10 positions
    assert memory.kv_cache_bytes(model, batch_size=4, length=10) == 192 * 4 * 10


def test_rss_is_kibibytes_on_linux_and_bytes_on_macos():
    assert memory.rss_bytes(3, "linux") == 3072
    assert memory.rss_bytes(3, "darwin") == 3


def test_device_peaks_exist_only_on_cuda():
    cpu = torch.device("cpu")
    memory.reset_peaks(cpu)  # nothing to reset, and no error
    assert memory.device_peaks(cpu) == (None, None)


def test_every_bench_result_carries_its_memory_and_round_trips(tiny):
    config = BenchConfig(prompt_length=6, output_length=5, batch_size=2, warmup_runs=0, runs=1)
    result = run_benchmark(tiny, config)
    usage = result.memory
    assert usage.peak_allocated_bytes is None and usage.peak_reserved_bytes is None  # CPU
    assert usage.weight_bytes == memory.weight_bytes(tiny.model)
    assert usage.kv_cache_bytes == memory.kv_cache_bytes(tiny.model, 2, 6 + 5)
    assert usage.peak_rss_bytes > usage.weight_bytes
    again = result_from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.memory == usage
    assert "memory: weights" in format_result(result) and "process peak RSS" in format_result(result)


def test_the_csv_row_carries_memory_in_mib_and_no_energy_on_the_cpu(tiny):
    import csv
    import io

    from inferlab.look.tables import csv_text

    result = run_benchmark(tiny, BenchConfig(prompt_length=4, output_length=2, warmup_runs=0, runs=1))
    [row] = list(csv.DictReader(io.StringIO(csv_text([result]))))
    assert float(row["weight_mib"]) == round(memory.weight_bytes(tiny.model) / 2**20, 4)
    assert float(row["peak_rss_mib"]) > 0
    assert row["peak_allocated_mib"] == row["joules_per_token"] == row["mean_watts"] == ""
