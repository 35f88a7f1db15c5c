"""Commands from the supervisor, agreed by every rank at the same step through a gloo group.

Rank 0 offers what its inbox holds in a one-element async broadcast every few steps and the
ranks read it one interval later, so control costs no device sync and almost no step time.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

OPS = ("pause", "resume", "checkpoint", "stop", "settings")


class Control:
    """Rank 0 drains `inbox`; every rank gets the same commands back at the same global step."""

    def __init__(self, inbox, rank: int, group, every: int = 4):
        self.inbox = inbox
        self.rank = rank
        self.group = group
        self.every = every
        self.active = inbox is not None
        self._count = torch.zeros(1, dtype=torch.int64)
        self._work = None
        self._offered: list[dict] = []

    def poll(self, global_step: int) -> list[dict]:
        """Call after every step; returns the commands every rank applies now."""
        if not self.active or global_step % self.every:
            return []
        agreed = self._complete()
        if self.rank == 0:
            self._offered = self._drain()
            self._count[0] = len(self._offered)
        self._work = dist.broadcast(self._count, src=0, group=self.group, async_op=True)
        return agreed

    def tick_paused(self, period: float = 0.3) -> list[dict]:
        """While paused: a blocking exchange every `period` s (so no collective times out)."""
        agreed = self._complete()
        if self.rank == 0:
            time.sleep(period)
        box = [self._drain() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return agreed + box[0]

    def finish(self) -> None:
        """Complete the broadcast in flight; every rank calls this at the same point."""
        self._complete()

    def _complete(self) -> list[dict]:
        if self._work is None:
            return []
        self._work.wait()
        self._work = None
        if int(self._count[0]) == 0:
            return []
        box = [self._offered if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _drain(self) -> list[dict]:
        cmds = []
        try:
            while self.inbox.poll():
                cmds.append(self.inbox.recv())
        except (EOFError, OSError):  # the supervisor is gone; the parent watch ends us
            pass
        return cmds
