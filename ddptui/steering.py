"""How a run is steered: every call queues a command for the supervisor's thread and returns at
once, so the dashboard's key handlers, the headless console and signal handlers may call it.
"""

from __future__ import annotations

import queue

from ddptui.outcome import EXIT_INTERRUPTED
from trainer.protocol.events import PARENT, event


class Steering:
    """The supervisor's public controls; `state` is the RunState the subclass keeps."""

    def __init__(self):
        # SimpleQueue: stop() runs in signal handlers, and Queue.put's lock is not reentrant.
        self._commands: queue.SimpleQueue = queue.SimpleQueue()

    def pause(self) -> None:
        self._commands.put({"op": "pause"})

    def resume(self) -> None:
        self._commands.put({"op": "resume"})

    def checkpoint(self) -> None:
        self._commands.put({"op": "checkpoint"})

    def change_settings(self, **settings) -> None:
        """Ask for new input-pipeline settings; every rank applies them at the next epoch."""
        self.state.apply(event("settings", PARENT, settings=settings, status="requested"))
        self._commands.put({"op": "settings", "settings": settings})

    def apply_now(self) -> None:
        """Pending settings take effect at the next agreed step instead of the next epoch."""
        self._commands.put({"op": "apply"})

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
        """Ask the rank for every thread's Python stack; they arrive as a message event."""
        self._commands.put({"op": "stacks", "slot": rank})

    def stop(self, status: str = "interrupted", code: int = EXIT_INTERRUPTED,
             reason: str = "") -> None:
        """Orderly end: ranks agree on a step, checkpoint if a directory is set, and exit.
        With a stalled rank nothing waits for it. A second call ends every process at once."""
        self._commands.put({"op": "stop", "status": status, "code": code, "reason": reason})

