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

    # -- rank by rank: queued for the run's thread (a script's: under run.elastic, or `t`) ------
    def stop_rank(self, rank: int) -> None:
        """The rank leaves at an agreed step; the others go on re-sharded as one fewer."""
        self._commands.put({"op": "stop_rank", "slot": rank})

    def restart_rank(self, rank: int) -> None:
        """A stopped or crashed rank joins again (as soon as its standby is warm); a running one
        leaves and joins again."""
        self._commands.put({"op": "restart_rank", "slot": rank})

    def kill_rank(self, rank: int) -> None:
        """SIGKILL the rank (a stalled one above all): crash recovery follows."""
        self._commands.put({"op": "kill_rank", "slot": rank})

    def stacks(self, rank: int) -> None:
        """Ask the rank for every thread's Python stack."""
        self._commands.put({"op": "stacks", "slot": rank})

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
