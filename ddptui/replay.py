"""A recorded run played back into a RunState, so the dashboard (or the console) shows it again:
for post-mortems, and for deterministic screen tests. Offers the supervisor's read-only face.
"""

from __future__ import annotations

import threading
import time

from ddptui.runstate import RunState
from trainer.protocol.events import read_events


class Replay:
    """Feeds a JSONL log's events into `state` in a thread, at `speed` x the recorded pace."""

    live = False  # no ranks to steer: the dashboard hides the control keys
    owns_ranks = False

    def __init__(self, path: str, speed: float = 1.0, events: list[dict] | None = None):
        self.log_path = path
        self.speed = speed
        self.events = events if events is not None else read_events(path)
        self.state = RunState({"log": path}, live=False)
        self.done = threading.Event()
        self.exit_code: int | None = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._play, name="replay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.exit_code

    def stop(self, status: str = "interrupted", code: int = 0) -> None:
        self._halt.set()

    def _play(self) -> None:
        start_wall = time.monotonic()
        first_t = self.events[0]["t"] if self.events else 0.0
        for ev in self.events:
            if self.speed > 0:
                due = start_wall + (ev["t"] - first_t) / self.speed
                if self._halt.wait(max(0.0, due - time.monotonic())):
                    break
            elif self._halt.is_set():
                break
            self.state.apply(ev)
        self.exit_code = self.state.exit_code or 0
        self.done.set()
