"""What the dashboard and the headless console may ask of a run, whoever serves it: a run ddptui
owns (Supervisor, ScriptRun), ranks launched elsewhere (Attach) or a recorded log (Replay).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import ClassVar

from ddptui.contract.state.capabilities import Capabilities
from ddptui.contract.state.runstate import RunState


class RunSource(ABC):
    """A run as the screens see it: `state` folds its events, `done` is set once no more can
    come, `exit_code` says how it ended. The class flags say what kind of source it is;
    `capabilities` what can act now. A steering call a source cannot take raises
    NotImplementedError, and the screens ask `capabilities` first."""

    can_steer: ClassVar[bool] = True  # pause, settings, checkpoint, ranks (a Replay: no)
    owns_ranks: ClassVar[bool] = True  # q ends the ranks (an Attach detaches, a Replay stops)
    can_end_job: ClassVar[bool] = False  # K ends a job it does not own (an Attach)
    can_detach: ClassVar[bool] = False  # d leaves the run going (a Viewer of a run's process)
    read_only: bool = False  # this dashboard may only watch (a Viewer's, for ddptui web)

    state: RunState
    done: threading.Event
    exit_code: int | None
    log_path: str

    @abstractmethod
    def start(self) -> None:
        """Begin: launch, listen or play (returns at once; a thread does the work)."""

    @abstractmethod
    def stop(self, status: str = "interrupted", code: int = 130) -> None:
        """End (an owned run: ranks agree on a step and exit; a second call kills them),
        detach or stop playing. Safe from a signal handler."""

    def close(self) -> None:
        """Leave the run going without this dashboard (can_detach)."""
        self._cannot("leave the run going")

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.exit_code

    def pids(self) -> set[int]:
        """Every process of the run seen so far (none where the source owns none)."""
        return set()

    @property
    def capabilities(self) -> Capabilities:
        """What can act now (the caller does not hold the state's lock)."""
        with self.state.lock:
            return Capabilities.of(self.state, steer=self.can_steer, read_only=self.read_only,
                                   over=self.done.is_set(),
                                   owns_ranks=self.owns_ranks, end_job=self.can_end_job)

    # -- steering: each queues or sends a command and returns at once ------------------------
    def pause(self) -> None:
        self._cannot("pause")

    def resume(self) -> None:
        self._cannot("resume")

    def checkpoint(self) -> None:
        self._cannot("checkpoint")

    def change_settings(self, request: str | None = None, **settings) -> None:
        """Ask for new input-pipeline settings; every rank applies them at the next epoch
        (`request`: the request's id, when a dashboard named it)."""
        self._cannot("change settings")

    def apply_now(self) -> None:
        """Pending settings take effect at the next agreed step instead of the next epoch."""
        self._cannot("apply settings")

    def stop_rank(self, rank: int) -> None:
        self._cannot("stop a rank")

    def restart_rank(self, rank: int) -> None:
        self._cannot("restart a rank")

    def kill_rank(self, rank: int) -> None:
        self._cannot("kill a rank")

    def restart_group(self, kill: int | None = None) -> None:
        """Every rank ends (`kill` at once) and the group starts again (a script's run)."""
        self._cannot("restart the group")

    def end_job(self) -> None:
        """End every rank of a job launched elsewhere now (can_end_job)."""
        self._cannot("end the job")

    def stacks(self, rank: int) -> None:
        """Ask the rank for every thread's Python stack (owns_ranks)."""
        self._cannot("take stacks")

    def _cannot(self, what: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot {what}")
