"""The bounded queue between a rank's telemetry and the thread that sends it (to the supervisor's
pipe or attach's socket): a step never waits on either. No torch here: a sidecar uses it too.
"""

from __future__ import annotations

import collections
import threading


class EventBuffer:
    """Events waiting for a sending thread. Bounded: when the reader falls far behind (or is
    away), the oldest are dropped and counted by rank (a relay's buffer holds a node's ranks),
    so a step never waits on a pipe or a socket."""

    def __init__(self, limit: int = 10_000):
        self.limit = limit
        self.events: collections.deque = collections.deque()
        self.dropped: collections.Counter = collections.Counter()  # rank -> events dropped
        self.ready = threading.Condition()
        self.closing = False

    def put(self, ev) -> None:
        with self.ready:
            self.events.append(ev)
            self._trim()
            self.ready.notify()

    def take(self) -> tuple[list, collections.Counter] | None:
        """Everything buffered and how many of each rank's were dropped before it; waits for
        events; None once closed and empty."""
        with self.ready:
            while not self.events and not self.closing:
                self.ready.wait()
            if not self.events:
                return None
            batch, dropped = list(self.events), self.dropped
            self.events.clear()
            self.dropped = collections.Counter()
            return batch, dropped

    def restore(self, batch: list, dropped: collections.Counter) -> None:
        """A batch that could not be sent goes back to the front."""
        with self.ready:
            self.events.extendleft(reversed(batch))
            self.dropped += dropped
            self._trim()

    def rest(self, seconds: float) -> None:
        """Wait `seconds` (events gather meanwhile), or less if the buffer is closed."""
        with self.ready:
            self.ready.wait_for(lambda: self.closing, seconds)

    def close(self) -> None:
        with self.ready:
            self.closing = True
            self.ready.notify()

    def _trim(self) -> None:
        while len(self.events) > self.limit:
            self.dropped[getattr(self.events.popleft(), "rank", None)] += 1
