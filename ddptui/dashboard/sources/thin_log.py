"""What attach keeps in its log of a job of many ranks: every event for the first minutes, then
each rank's per-step telemetry rolled up once a minute (contract/rollup.py); state changes,
stalls, crashes, epochs and stacks always whole, each after its rank's telemetry before it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ddptui.contract.protocol.events import Event
from ddptui.contract.rollup import FOLDED, FULL_DETAIL_UP_TO, fold

FULL_S = 300.0  # the first minutes in full: the start of a job is when it is read closest
FULL_ENV = "DDPTUI_LOG_FULL_S"  # another span for them
EVERY_S = 60.0  # then a rank's telemetry an entry this often (a day of 512 ranks: < 1 GB)


class ThinLog:
    """put() each event attach records; close() writes what is held."""

    def __init__(self, write: Callable[[Event], None], full_s: float | None = None,
                 every_s: float = EVERY_S, from_ranks: int = FULL_DETAIL_UP_TO + 1):
        self.write, self.every_s, self.from_ranks = write, every_s, from_ranks
        self.full_s = _full_s() if full_s is None else full_s
        self.start: float | None = None
        self.ranks: set[int] = set()
        self.held: dict[int, list[Event]] = {}  # rank -> its telemetry since its last entry

    def put(self, ev: Event) -> None:
        self.start = ev.t if self.start is None else self.start
        if ev.rank >= 0:
            self.ranks.add(ev.rank)
        thin = len(self.ranks) >= self.from_ranks and ev.t - self.start >= self.full_s
        if not isinstance(ev, FOLDED) or not thin:
            self._flush(ev.rank)
            self.write(ev)
            return
        held = self.held.setdefault(ev.rank, [])
        held.append(ev)
        if ev.t - held[0].t >= self.every_s:
            self._flush(ev.rank)

    def close(self) -> None:
        for rank in list(self.held):
            self._flush(rank)

    def _flush(self, rank: int) -> None:
        held = self.held.pop(rank, None)
        for ev in fold(held) if held else ():
            self.write(ev)


def _full_s() -> float:
    try:
        return max(0.0, float(os.environ.get(FULL_ENV, FULL_S)))
    except ValueError:
        return FULL_S
