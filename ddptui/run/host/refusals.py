"""What a dashboard's refused orders may cost the run: a few lines in its log, the rest counted and
summed up, and a dashboard that keeps at it closed. Lives in the run's process (host.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

WINDOW_S = 10.0  # the span each dashboard's refusals are counted over
SAID = 10  # refusals said one line each, a dashboard a window: a person reads one a second
CLOSE_AFTER = 100  # refusals in a window that close the dashboard: no key sends that many


@dataclass
class _Count:
    since: float  # when its window began
    refused: int = 0  # in this window
    unsaid: int = 0  # in this window, beyond SAID
    closed: bool = False  # it was closed for them: from then on its refusals are only summed


class Refusals:
    """Refused orders by dashboard pid (its connections together: one that attaches again is
    still counted), from the readers' threads; `due()` gives the sums of windows that ended."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[int, _Count] = {}

    def refused(self, pid: int, why: str, now: float) -> tuple[str | None, bool]:
        """One refused order of dashboard `pid`: the line to say (None: counted, said later)
        and whether to close its connection."""
        with self._lock:
            c = self._counts.setdefault(pid, _Count(now))
            c.refused += 1
            if c.closed:
                c.unsaid += 1
                return None, True
            if c.refused >= CLOSE_AFTER:
                c.closed = True
                return (f"closed the dashboard of pid {pid}: {c.refused} of its orders were "
                        f"refused within {WINDOW_S:.0f} s (the last: {why})"), True
            if c.refused > SAID:
                c.unsaid += 1
                return None, False
            return f"a dashboard's message was dropped: {why} (dashboard pid {pid})", False

    def due(self, now: float, every: bool = False) -> list[str]:
        """A line for each dashboard whose window ended (`every`: the run ends, all of them)
        with orders counted and not said; a new window begins at its next refusal."""
        lines = []
        with self._lock:
            for pid, c in list(self._counts.items()):
                if not every and now - c.since < WINDOW_S:
                    continue
                if c.unsaid:
                    lines.append(f"dropped {c.unsaid:,} more orders from dashboard pid {pid} in "
                                 f"the last {min(now - c.since, WINDOW_S):.0f} s")
                if c.closed:
                    self._counts[pid] = _Count(now, closed=True)
                else:
                    del self._counts[pid]
        return lines
