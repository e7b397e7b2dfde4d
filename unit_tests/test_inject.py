"""The injected violation: a delay per decode step that grows with the cache position, never on by default."""

import pytest
import torch

from inferlab.measure.bench import BenchConfig
from inferlab.measure.inject import PositionDelayClock, where_to_inject


class Marks:
    """A TokenClock that counts its calls."""

    def __init__(self) -> None:
        self.started, self.marks = 0, 0

    def start(self) -> None:
        self.started += 1

    def mark(self) -> None:
        self.marks += 1

    def finish(self):
        return tuple(float(i) for i in range(self.marks))


def test_the_delay_grows_with_the_position_each_decode_step_wrote():
    clock = PositionDelayClock(Marks(), 2.0, prompt_length=10, where="host", device=torch.device("cpu"))
    # step 0 is the prefill; decode step i writes position P + i - 1
    assert [clock.delay_us(i) for i in range(4)] == [0.0, 20.0, 22.0, 24.0]


def test_the_wrapped_clock_still_gets_every_call():
    inner = Marks()
    clock = PositionDelayClock(inner, 1.0, prompt_length=3, where="host", device=torch.device("cpu"))
    clock.start()
    for _ in range(5):
        clock.mark()
    assert (inner.started, inner.marks, clock.finish()) == (1, 5, (0.0, 1.0, 2.0, 3.0, 4.0))


class GraphEngine:
    class options:
        graphs = True


def test_graph_replaying_engines_on_cuda_wait_on_the_device_and_everything_else_on_the_host():
    assert where_to_inject(GraphEngine(), torch.device("cuda")) == "device"
    assert where_to_inject(GraphEngine(), torch.device("cpu")) == "host"
    assert where_to_inject(object(), torch.device("cuda")) == "host"


def test_no_delay_unless_asked_and_a_negative_one_is_refused():
    assert BenchConfig().inject_delay_per_position_us == 0.0
    with pytest.raises(ValueError, match="must be >= 0 us, got -1"):
        PositionDelayClock(Marks(), -1.0, 4, "host", torch.device("cpu"))
