"""Energy from NVML's counter, tested with a fake NVML on the CPU: J/token, watts, the update
interval, and every way the counter can be missing (said once, the run goes on)."""

import json
import math
import sys

import pytest
import torch

from inferlab.look import tables
from inferlab.measure import energy
from inferlab.measure.bench import COST_SPAN_S, BenchConfig, measure_costs, prepare_case, result_from_dict, run_benchmark


class FakeTime:
    """A clock that only moves when slept on or advanced."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeNvml:
    """pynvml's energy API: a board drawing `watts`, its mJ counter refreshed every `interval_s`."""

    class NVMLError(Exception):
        pass

    def __init__(self, time: FakeTime, watts: float = 300.0, interval_s: float = 0.02,
                 starts: bool = True, counter: bool = True) -> None:
        self.time, self.watts, self.interval_s = time, watts, interval_s
        self.starts, self.counter = starts, counter

    def nvmlInit(self) -> None:
        if not self.starts:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        if not self.counter:
            raise self.NVMLError("Not Supported")
        refreshed = math.floor(self.time() / self.interval_s + 1e-9) * self.interval_s
        return int(round(refreshed * self.watts * 1e3))


def locate(nvml):
    return nvml.nvmlDeviceGetHandleByIndex(0)


def test_update_interval_is_the_time_between_two_changes_of_the_counter():
    clock = FakeTime()
    nvml = FakeNvml(clock, interval_s=0.02)
    meter = energy.meter_from_nvml(nvml, locate, clock, clock.sleep)
    assert meter.update_interval_s == pytest.approx(0.02, abs=1.5e-3)  # polled every 1 ms


def test_a_counter_that_never_changes_has_no_interval():
    clock = FakeTime()
    assert energy.update_interval(lambda: 7, clock, clock.sleep, limit_s=0.1) is None


def test_joules_per_token_and_mean_watts_from_two_reads():
    clock = FakeTime()
    meter = energy.meter_from_nvml(FakeNvml(clock, watts=300.0, interval_s=0.02), locate, clock, clock.sleep)
    clock.now = 200.0  # on a refresh boundary: both reads exact
    started = meter.start()
    clock.now = 202.0
    reading = meter.stop(started, output_tokens=1000)
    assert reading.joules == pytest.approx(600.0)  # 300 W x 2 s
    assert reading.joules_per_token == pytest.approx(0.6)
    assert reading.mean_watts == pytest.approx(300.0)
    assert reading.relative_uncertainty == pytest.approx(2 * meter.update_interval_s / 2.0)
    saved = reading.to_dict()
    assert saved["resolution_j"] == 0.001 and saved["source"] == energy.SOURCE
    assert energy.energy_from_dict(json.loads(json.dumps(saved))) == reading


@pytest.mark.parametrize("nvml_kwargs, fragment", [
    (dict(starts=False), "NVML did not start (Driver Not Loaded)"),
    (dict(counter=False), "energy counter cannot be read (Not Supported"),
])
def test_missing_nvml_or_counter_is_a_reason_not_an_error(nvml_kwargs, fragment):
    clock = FakeTime()
    result = energy.meter_from_nvml(FakeNvml(clock, **nvml_kwargs), locate, clock, clock.sleep)
    assert isinstance(result, energy.Unavailable) and fragment in result.reason
    assert result.to_dict() == {"available": False, "reason": result.reason}


def test_cpu_and_missing_nvidia_ml_py_are_reasons(monkeypatch):
    assert "NVIDIA GPUs only" in energy.open_meter(torch.device("cpu")).reason
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert "nvidia-ml-py is not installed" in energy.open_meter(torch.device("cuda", 0)).reason


def test_the_counter_is_read_around_one_block_of_requests_apart_from_the_timed_runs(tiny):
    fake = FakeTime()
    nvml = FakeNvml(fake, watts=250.0, interval_s=0.01)
    meter = energy.meter_from_nvml(nvml, locate, fake, fake.sleep)
    reads = []
    original = nvml.nvmlDeviceGetTotalEnergyConsumption

    def counting(handle):
        reads.append(fake.now)
        fake.now += 1.0  # each read one fake second later: the span between the two reads is 1 s
        return original(handle)

    nvml.nvmlDeviceGetTotalEnergyConsumption = counting
    config = BenchConfig(prompt_length=4, output_length=3, batch_size=2, warmup_runs=1, runs=2)
    case = prepare_case(tiny, config)
    runs = [case.measure_one() for _ in range(config.runs)]
    assert reads == []  # the timed runs (and warm-ups) never touch the counter
    seconds = iter(range(100))  # the block's clock: one second further at each look
    costs = measure_costs(case, meter, clock=lambda: float(next(seconds)))
    assert len(reads) == 2  # once before the block, once after it
    reading = costs.energy
    # the block runs until COST_SPAN_S (2 s) have passed: two requests of batch 2 x 3 tokens
    assert COST_SPAN_S == 2.0 and reading.output_tokens == 2 * 2 * 3
    assert reading.joules == pytest.approx(250.0)  # 1 s at 250 W between the meter's two reads
    assert reading.joules_per_token == pytest.approx(250.0 / 12)
    result = case.result(runs, costs)
    assert result_from_dict(json.loads(json.dumps(result.to_dict()))).energy == reading
    assert "J/token" in tables.format_result(result) and "1 mJ resolution" in tables.format_result(result)


def test_without_a_gpu_or_a_meter_no_extra_request_runs(tiny, monkeypatch):
    config = BenchConfig(prompt_length=4, output_length=3, warmup_runs=0, runs=1)
    case = prepare_case(tiny, config)
    monkeypatch.setattr(case, "measure_one", lambda: pytest.fail("a request ran for the costs"))
    costs = measure_costs(case, energy.open_meter(torch.device("cpu")))
    assert isinstance(costs.energy, energy.Unavailable) and costs.memory.peak_rss_bytes > 0


def test_the_sweep_table_says_once_why_energy_is_missing(tiny):
    config = BenchConfig(prompt_length=4, output_length=2, warmup_runs=0, runs=1)
    results = [run_benchmark(tiny, config), run_benchmark(tiny, config)]
    notes = tables.cost_notes(results)
    assert sum(line.startswith("energy:") for line in notes) == 1
    assert all(r.energy.reason in notes[-1] for r in results)


def test_pci_bus_id_is_in_nvmls_format():
    assert energy.pci_bus_id(0, 0x1B, 0) == b"00000000:1B:00.0"
