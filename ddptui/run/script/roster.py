"""Who is in a script's world: what each rank opted into, which left (s), were killed (k) or wait
to join (r, run.elastic()), and the membership's decisions (ddptui/run/membership.py) on them.
"""

from __future__ import annotations

import time

from ddptui.contract.protocol.events import PARENT, Event, Rank, World
from ddptui.contract.states import RankState
from ddptui.run.membership import Fail, Membership
from ddptui.run.ports import free_port


class ScriptWorld:
    """One per attempt. Feed it the ranks' events and deaths; it returns the membership's
    actions (Tell, Say, Kill, Fail) for the run to carry out."""

    def __init__(self, slots: list[int]):
        self.slots = slots
        self.membership = Membership(list(slots), lambda: f"tcp://127.0.0.1:{free_port()}",
                                     prepared_joins=True)
        self.controls: dict[int, set[str]] = {}  # what each rank opted into (ddptui.init)
        self.killed: dict[int, str] = {}  # pid -> why ddptui killed that process
        self.left: set[int] = set()  # pids of the processes that left the world on request
        # slot -> pid of its process that waits for a join order (the slot's last process may
        # still be ending beside it)
        self.standing_by: dict[int, int] = {}
        self.leader = 0  # the world's rank 0: the run's orders go to it

    @property
    def opted(self) -> set[str]:
        return set().union(*self.controls.values())

    @property
    def elastic(self) -> bool:
        """Every rank gave run.elastic(): s and k act on one rank, a crash is survived."""
        return bool(self.slots) and all("elastic" in self.controls.get(s, ())
                                        for s in self.slots)

    def reported(self, ev: Event) -> list:
        """A rank's event: what it takes, that it entered or left a world, a world it confirmed."""
        slot = ev.rank
        if isinstance(ev, Rank) and ev.control:
            self.controls[slot] = set(ev.control)
        match ev:
            case Rank(state=RankState.STANDBY) if self.is_standby(slot, ev.pid):
                return self.membership.standby_ready(slot, time.time())
            case Rank(standby="prepared"):
                return self.membership.prepared(slot, time.time())
            case Rank(state=RankState.RUNNING):
                self.membership.entered(slot)
            case Rank(state=RankState.STOPPED) if slot in self.membership.leaving:
                self.left.add(ev.pid)  # out of the world; its process ends next
                return self.membership.left(slot)  # a standby, if r asked for it back
            case World(generation=int(gen)) if gen and slot != PARENT:
                self.leader = ev.ranks[0]
                return self.membership.world_confirmed(gen, time.time())
        return []

    def stop(self, slot: int) -> list:
        return self.membership.stop(slot, time.time()) if self.elastic else []

    def restart(self, slot: int) -> list:
        """r: a stopped or crashed rank joins from a standby started now (a running one leaves
        first)."""
        if not self.elastic:
            return []
        return self.membership.restart(slot, slot in self.standing_by, time.time())

    def is_standby(self, slot: int, pid: int | None) -> bool:
        return pid is not None and self.standing_by.get(slot) == pid

    def wants_standby(self, slot: int) -> bool:
        """A standby is started only for a rank that r asked back (a script's process runs the
        script up to ddptui.init(): not kept warm for every rank that is out)."""
        return slot in self.membership.wanted and slot not in self.standing_by

    def out_state(self, slot: int) -> tuple[str, str]:
        """How an out slot is shown while its standby waits: stopped or crashed, and why."""
        return self.membership.out.get(slot, (RankState.STOPPED, ""))

    def died(self, slot: int, alive: set[int], why: str, code: int) -> list:
        """A rank ended with an error: the others re-form without it, or the run fails with its
        exit `code`, as under torchrun, when they cannot (none is left, or not every rank is
        elastic)."""
        lost = [Fail(f"rank {slot} {why}", code)]
        if not self.elastic:
            return lost
        actions = self.membership.died(slot, alive, True, why, time.time())
        return lost if any(isinstance(a, Fail) for a in actions) else actions

    def preparing(self, slot: int) -> bool:
        """The slot's joiner runs its script up to run.elastic(); the members train on."""
        held = self.membership.held
        return held is not None and held.joiner == slot

    def is_member(self, slot: int) -> bool:
        return slot in self.membership.members
