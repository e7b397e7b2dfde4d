"""How a sweep shows its progress: the `Progress` protocol, `NullProgress` (nothing) and
`TqdmProgress` (a bar on stderr)."""

from __future__ import annotations

import sys
from typing import Protocol


class Progress(Protocol):
    """start(total measured runs); begin(configuration) before each; advance(runs) as they finish;
    grow(runs) when a top-up round adds to the total; close()."""

    def start(self, total: int) -> None: ...

    def begin(self, label: str) -> None: ...

    def advance(self, steps: int = 1) -> None: ...

    def grow(self, steps: int) -> None: ...

    def close(self) -> None: ...


class NullProgress:
    """Shows nothing (tests, scripts)."""

    def start(self, total: int) -> None:
        pass

    def begin(self, label: str) -> None:
        pass

    def advance(self, steps: int = 1) -> None:
        pass

    def grow(self, steps: int) -> None:
        pass

    def close(self) -> None:
        pass


class TqdmProgress:
    """A tqdm bar on stderr over every measured run, the current configuration as its postfix."""

    def __init__(self) -> None:
        self._bar = None

    def start(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc="sweep", unit="run", file=sys.stderr, dynamic_ncols=True)

    def begin(self, label: str) -> None:
        self._bar.set_postfix_str(label)

    def advance(self, steps: int = 1) -> None:
        self._bar.update(steps)

    def grow(self, steps: int) -> None:
        self._bar.total += steps
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
