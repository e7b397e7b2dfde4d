"""The sweep's measurement order: which configuration each measured run belongs to, its round and
its place in the round (`measurement_order`), and when it ran (`ScheduledRun`).

``interleaved``: rounds, each visiting its configurations once in an order shuffled anew by one
``random.Random(seed)``, so that the host's drift is spread over every configuration;
``sequential``: each configuration's runs back to back. No state of their own: the generator
is an argument (`round_slots` and `base_rounds` advance the one passed in), or made from the seed.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Sequence

ORDERS = ("interleaved", "sequential")


@dataclass(frozen=True)
class Slot:
    """A measured run's place in the sweep: configuration `config` (an index into `bench_configs`),
    in round `round`, at `position` within that round."""

    config: int
    round: int
    position: int


def round_slots(shuffler: random.Random, configs: Sequence[int], round_index: int) -> tuple[Slot, ...]:
    """One interleaved round: `configs` (indices into `bench_configs`) in an order shuffled by `shuffler`."""
    visit = list(configs)
    shuffler.shuffle(visit)
    return tuple(Slot(index, round_index, position) for position, index in enumerate(visit))


def base_rounds(shuffler: random.Random, count: int, runs: int) -> tuple[Slot, ...]:
    """`runs` interleaved rounds over all `count` configurations, each shuffled anew by `shuffler`."""
    return tuple(slot for r in range(runs) for slot in round_slots(shuffler, range(count), r))


def measurement_order(count: int, runs: int, order: str, seed: int,
                      top_up_rounds: Sequence[Sequence[int]] = ()) -> tuple[Slot, ...]:
    """Every measured run of `count` configurations, in the order measured.

    interleaved: `runs` rounds, each a permutation of the configurations drawn from
    ``random.Random(seed)``, anew each round; then a round per entry of `top_up_rounds` (the
    configurations that round measured), each shuffled, in ascending order, by the same
    generator. sequential: configuration after configuration; a run's round is its index among
    its configuration's runs and its position the configuration's index.
    """
    if order == "sequential":
        assert not top_up_rounds, "top-up rounds are interleaved"
        return tuple(Slot(index, r, index) for index in range(count) for r in range(runs))
    assert order == "interleaved", order
    shuffler = random.Random(seed)
    slots = base_rounds(shuffler, count, runs)
    for r, configs in enumerate(top_up_rounds, start=runs):
        slots += round_slots(shuffler, sorted(configs), r)
    return slots


@dataclass(frozen=True)
class ScheduledRun:
    """When a measured run ran: its round, its position in the round, its start (s since the first measured run)."""

    round: int
    position: int
    start_s: float

    def to_dict(self) -> dict:
        return asdict(self)
