"""What a run that ddptui owns has in common, whether it runs the built-in trainer (Supervisor)
or your script (ScriptRun): one thread drives it, its log is written as it goes, and the
dashboard and signal handlers wait on `done` and read `exit_code`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from ddptui.source import RunSource
from trainer.protocol.events import JsonlWriter


class OwnedRun(RunSource):
    """Subclasses set `log_path`, `_thread` (their main loop), and `sampler` once it exists."""

    def __init__(self):
        self.done = threading.Event()
        self.exit_code: int | None = None
        self.sampler = None
        self._writer: JsonlWriter | None = None
        # SimpleQueue: stop() runs in signal handlers, and Queue.put's lock is not reentrant.
        self._commands: queue.SimpleQueue = queue.SimpleQueue()

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        self._writer = JsonlWriter(self.log_path)
        self._thread.start()

    def _queued(self) -> Iterator[dict]:
        """The commands the steering calls queued, oldest first (the run's thread only)."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _closed(self) -> None:
        """The last of the thread's way out: NVML and the log closed, then `done`."""
        if self.sampler is not None:
            self.sampler.close()
        if self._writer:
            self._writer.close()
        self.done.set()
