"""How a run is ending and why: the first failure, a stop asked for, the ranks' own last errors
(a crash is reported with them) and the corrupt samples skipped over every rank.
"""

from __future__ import annotations

from typing import NamedTuple

from ddptui.contract.protocol.events import BadSample, Notice, Usage

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Ending(NamedTuple):
    """How a run ends: its last `run` event's status, ddptui's exit code, and why."""

    status: str
    code: int
    reason: str


class Outcome:
    """Written by the run's own thread only."""

    def __init__(self):
        self.failure: Ending | None = None  # the first rank lost beyond recovery, or bad input
        self.stop: Ending | None = None  # the stop asked for (q, Ctrl-C, SIGTERM)
        self.errors: dict[int, str] = {}  # rank -> its last error message
        self.usage_error: str | None = None
        self.bad: set[str] = set()  # distinct corrupt samples skipped, over every rank

    @property
    def ending(self) -> bool:
        return bool(self.stop or self.failure)

    def message(self, ev: Notice) -> str | None:
        """Note a rank's message; returns why the run must stop, if it must (bad samples)."""
        if ev.level == "error":
            self.errors[ev.rank] = ev.text
            if isinstance(ev, Usage) and self.usage_error is None:
                self.usage_error = ev.text or "bad input"
        if isinstance(ev, BadSample):
            self.bad.add(ev.path or "")
            limit = ev.limit or 0
            if len(self.bad) > limit and self.stop is None:
                return (f"{len(self.bad)} corrupt samples, more than --max-bad-samples {limit}; "
                        f"the last: {ev.path}")
        return None

    def known_bad(self, ev: Notice) -> bool:
        """Another rank already named this corrupt sample."""
        return isinstance(ev, BadSample) and ev.path in self.bad

    def fail(self, code: int, reason: str) -> bool:
        """The first failure wins (and none after a stop was asked for)."""
        if self.failure is None and self.stop is None:
            self.failure = Ending("failed", code, reason)
            return True
        return False

    def asked_to_stop(self, ending: Ending) -> bool:
        """The first stop asked for is how the run ends; False when one was asked already."""
        if self.stop is not None:
            return False
        self.stop = ending
        return True

    def result(self, all_done: bool) -> Ending:
        """The `run` event's status, the process's exit code, and why."""
        if self.failure or self.stop:
            return self.failure or self.stop
        if all_done:
            return Ending("done", EXIT_OK, "")
        return Ending("failed", EXIT_FAILED, "ranks ended unexpectedly")
