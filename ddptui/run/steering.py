"""The supervisor's public face: the calls that steer a run (each queues a command for the
supervisor's thread and returns at once, so key handlers and signal handlers may call it) and
what the run says about itself (its processes, its world, how it ended).
"""

from __future__ import annotations

from ddptui.run.outcome import EXIT_INTERRUPTED
from ddptui.run.owned import OwnedRun
from ddptui.run.processes import RankProcess
from trainer.protocol.events import PARENT, event, settings_request


class Steering(OwnedRun):
    """Base of the Supervisor, which keeps `state` (the RunState), `pool`, `world` (the
    Membership), and the thread these calls talk to."""

    def __init__(self):
        OwnedRun.__init__(self)
        self._told: dict[str, int] = {}  # settings request id -> the leader it was sent to

    def pause(self) -> None:
        self.state.apply(event("run", PARENT, status="pausing"))
        self._commands.put({"op": "pause"})

    def resume(self) -> None:
        self.state.apply(event("run", PARENT, status="resuming"))
        self._commands.put({"op": "resume"})

    def checkpoint(self) -> None:
        self._commands.put({"op": "checkpoint"})

    def change_settings(self, **settings) -> None:
        """Ask for new input-pipeline settings; every rank applies them at the next epoch."""
        requested, cmd = settings_request(settings)
        self.state.apply(requested)
        self._commands.put(cmd)

    def apply_now(self) -> None:
        """Pending settings take effect at the next agreed step instead of the next epoch."""
        self._commands.put({"op": "apply"})

    def stop(self, status: str = "interrupted", code: int = EXIT_INTERRUPTED,
             reason: str = "") -> None:
        """Orderly end: ranks agree on a step, checkpoint if a directory is set, and exit.
        With a stalled rank nothing waits for it. A second call ends every process at once."""
        self._commands.put({"op": "stop", "status": status, "code": code, "reason": reason})

    def refuse(self, action: str) -> str | None:
        """Why `action` (pause, checkpoint, settings...) cannot be done; None when it can."""
        if action == "checkpoint" and not self.config.checkpoint.dir:
            return "no --checkpoint-dir was given"
        return None

    def pids(self) -> set[int]:
        """Every process of the run seen so far: ranks and their workers."""
        return self.pool.pids()

    def say(self, text: str, level: str = "info", **fields) -> None:
        """A message of the supervisor's own, in the log and the event pane (its thread only)."""
        self._emit("message", level=level, text=text, **fields)

    def _send(self, cmd: dict) -> None:
        # The world's rank 0 is the authority: it offers commands to every rank at an agreed step.
        if self.members:
            self.slots[self.members[0]].tell(cmd)
            if cmd.get("request"):
                self._told[cmd["request"]] = self.members[0]

    def _ask_again(self) -> None:
        """Settings requests still unanswered by a leader that has left the world (stopped or
        died with them in its pipe) go to the new leader; rank 0's answer names each."""
        asked = self.state.unanswered()
        self._told = {rid: slot for rid, slot in self._told.items() if rid in asked}
        for rid, settings in asked.items():
            if self.members and self._told.get(rid, self.members[0]) not in self.members:
                self._send({"op": "settings", "settings": settings, "request": rid})

    @property
    def slots(self) -> dict[int, RankProcess]:
        """Each rank slot's current process."""
        return self.pool.slots

    @property
    def members(self) -> list[int]:
        """The slots in the world (the one being formed, while a change is unconfirmed)."""
        return self.world.members

    def world_changing(self) -> bool:
        """A leave or join is under way (the autotuner waits for it)."""
        return not self.world.idle()

    def autotune_done(self, best: dict, rate: float, results: list) -> None:
        from ddptui.run.autotune import describe_settings

        tried = "; ".join(f"{describe_settings(s)} {r:,.0f}" for s, r in results)
        self.say(f"autotune kept {describe_settings(best)} ({rate:,.0f} img/s; tried {tried})",
                 autotune=best)

