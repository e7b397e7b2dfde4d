"""Grid barriers: the programs of one launch meet at an arrival count in global memory, where a
kernel boundary would be. Every program must be resident at once; a program that waits too long
(`SPIN_LIMIT` polls) counts an error instead of hanging, and every later wait gives up at once.
Under Triton's interpreter, which runs programs one after another, a barrier never opens: the
kernels that use one run each phase as a launch of its own there."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from inferlab.fast.kernels.launch import kept

SPIN_LIMIT = 1 << 20  # polls of a barrier before a program gives up and counts an error (about a second)


@triton.jit
def _grid_arrive(bar_ptr):
    """Count this program's arrival once every thread's stores of the phase are issued."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _grid_wait(bar_ptr, err_ptr, target, SPIN: tl.constexpr):
    """Wait until the count reaches `target`; after SPIN polls, count an error in err_ptr and go on.
    Once one wait has given up, every later one (in this launch or the next) gives up at once, so
    a grid that cannot be resident costs about one SPIN, not one per barrier, and is reported.
    (Polling by volatile loads instead of atomics changed nothing: docs/perf/h100/targets-4.md.)"""
    errors = tl.load(err_ptr, volatile=True)  # issued before the acquire, so the two loads overlap
    count = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    polls = tl.where(errors > 0, SPIN, 0)
    while (count < target) & (polls < SPIN):
        count = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
        polls += 1
    if count < target:
        tl.atomic_add(err_ptr, 1)
    tl.debug_barrier()


def interpreted() -> bool:
    """Under Triton's interpreter (programs one after another: a barrier would never open)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def wait_errors(device: torch.device) -> torch.Tensor:
    """The count of barrier waits that gave up on `device`, shared by every kernel with grid barriers."""
    errors, = kept(("grid-wait-errors", device), lambda: (torch.zeros(1, device=device, dtype=torch.int32),))
    return errors


def barrier_errors(device: torch.device) -> int:
    """Barrier waits that gave up (`SPIN_LIMIT` polls) in the launches on `device` so far: 0
    unless some launch's programs were not all resident at once. Synchronizes."""
    return int(wait_errors(device).item())
