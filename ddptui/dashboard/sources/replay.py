"""A recorded run played back into a RunState, so the dashboard (or the console) shows it again:
for post-mortems, and for deterministic screen tests. Offers the supervisor's read-only face.
A log is read as it is played, so an hour-long one costs no more memory than a minute.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from ddptui.contract.protocol.codec import decode, event_of
from ddptui.contract.protocol.events import Event
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.source import RunSource

FIRST_LINE_MAX = 1 << 16  # a log's first line is one short event; another file's may be long


def not_a_log(path: str) -> str | None:
    """Why `path` is not a ddptui log, or None: every log starts with an event (blank lines
    aside), so a file whose first line is not one is something else."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            number = 0
            while line := f.readline(FIRST_LINE_MAX):
                number += 1
                if line.strip():
                    return None if decode(line) else f"line {number} is not one of its events"
    except OSError as e:
        return e.strerror or str(e)
    return "it is empty"


class Replay(RunSource):
    """Feeds a JSONL log's events into `state` in a thread, at `speed` x the recorded pace."""

    can_steer = False  # no ranks to steer: the dashboard hides the control keys
    owns_ranks = False

    def __init__(self, path: str, speed: float = 1.0, events: list[dict] | None = None):
        self.log_path = path
        self.speed = speed
        self.events = events  # its lines given as JSON objects (tests), or None: read from `path`
        self.state = RunState({"log": path}, live=False)
        self.done = threading.Event()
        self.exit_code: int | None = None
        self.bad_lines: list[int] = []  # line numbers that are not events, skipped
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._play, name="replay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, status: str = "interrupted", code: int = 0) -> None:
        self._halt.set()

    def _play(self) -> None:
        start_wall, first_t = time.monotonic(), None
        try:
            for ev in self._read():
                if first_t is None:
                    first_t = ev.t
                if self.speed > 0:
                    due = start_wall + (ev.t - first_t) / self.speed
                    if self._halt.wait(max(0.0, due - time.monotonic())):
                        break
                elif self._halt.is_set():
                    break
                self.state.apply(ev)
        except OSError as e:  # unreadable, or gone while playing
            self.state.say(f"cannot read {self.log_path}: {e.strerror or e}", "error")
        finally:
            self.exit_code = self.state.exit_code or 0
            self.done.set()

    def _read(self) -> Iterator[Event]:
        if self.events is not None:
            yield from (ev for ev in map(event_of, self.events) if ev is not None)
            return
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                ev = decode(line)
                if ev is not None:
                    yield ev
                elif line.strip():  # cut short by a crash, or written over: the rest still plays
                    self.bad_lines.append(number)
                    if len(self.bad_lines) == 1:
                        self.state.say(self.skipped(), "warning")
        if len(self.bad_lines) > 1:
            self.state.say(self.skipped(), "warning")

    def skipped(self) -> str:
        """What was skipped of the log: its first line that is not an event, and how many."""
        more = len(self.bad_lines) - 1
        return (f"{self.log_path} line {self.bad_lines[0]} is not a ddptui event: skipped"
                + (f" (and {more} more such line{'s' if more > 1 else ''})" if more else ""))
