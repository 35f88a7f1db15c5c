"""When each event from a rank elsewhere was sent, on this process's clock, and how far behind
this process is: attach judges a rank by when it spoke, never by when a busy dashboard got to it.
"""

from __future__ import annotations

import statistics


class SentTime:
    """sent() for each event as it is received; judged(now) at each check."""

    def __init__(self) -> None:
        # rank -> the least (received - its own stamp) seen: its clock's offset from ours plus
        # the quickest delivery; from then on stamp + offset is when it was sent, in our time.
        self.offset: dict[int, float] = {}
        self.behind = 0.0  # how far this process is behind the events it reads, s
        self._lags: dict[int, float] = {}  # rank -> its latest lag since the last check

    def sync(self, rank: int, stamp: float, received: float) -> None:
        """A rank's clock as its link connected (a Clock event): the offset starts again there,
        before its backlog (whose gaps are old on purpose) can mislead it."""
        self.offset[rank] = received - stamp

    def sent(self, rank: int, stamp: float, received: float) -> float:
        gap = received - stamp
        offset = self.offset[rank] = min(self.offset.get(rank, gap), gap)
        self._lags[rank] = gap - offset  # one a rank: a node's backlog is one node's say
        return stamp + offset

    def judged(self, now: float) -> float:
        """The time to judge silences at: `now`, less how far behind the events read since the
        last check were: the median over the ranks of each one's latest (a rank's or a node's
        backlog sent on reconnecting is old on purpose, and is one say among many)."""
        if self._lags:
            self.behind = statistics.median_low(self._lags.values())
            self._lags.clear()
        return now - self.behind
