"""Who is in the world and which change is under way: a pure state machine. It takes requests
(stop, restart) and facts (a standby is warm, a rank died, a change was confirmed, time passed)
and returns the actions the supervisor carries out; it starts, kills and reads nothing itself.

One change at a time: a leave or a join is ordered, then confirmed by the new world's `world`
event; requests that arrive meanwhile wait their turn. A member that does not confirm within
`timeout` seconds is killed, and its death is handled like any other. A script's joiner
(`prepared_joins`) runs its script up to run.elastic() first: the members, training meanwhile,
are told to form the world only once it says it is prepared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from ddptui.contract.protocol.orders import (
    ChangeSettings,
    Host,
    Join,
    Order,
    Recover,
    Reform,
    WorldOrder,
)
from ddptui.contract.states import RankState
from ddptui.contract.wording import count
from ddptui.run.actions import Fail, Joining, Kill, Say, Standby, Tell

CHANGE_TIMEOUT_S = 60.0




@dataclass
class Membership:
    """`members`: the world as ordered (the future one while a change is unconfirmed);
    `confirmed`: the last world the ranks confirmed."""

    members: list[int]
    new_address: Callable[[], str]
    timeout: float = CHANGE_TIMEOUT_S
    confirmed: list[int] = field(default_factory=list)
    change: WorldOrder | None = None  # the order not confirmed yet
    deadline: float = 0.0
    announced: set[int] = field(default_factory=set)  # members that entered the new world
    deferred: list[tuple[str, int]] = field(default_factory=list)
    leaving: set[int] = field(default_factory=set)
    wanted: set[int] = field(default_factory=set)  # join as soon as their standby is ready
    ready: set[int] = field(default_factory=set)  # slots with a warm standby
    out: dict[int, tuple[str, str]] = field(default_factory=dict)  # (stopped|crashed, why)
    generation: int = 0
    asked: dict[str, int] = field(default_factory=dict)  # settings request id -> its leader
    prepared_joins: bool = False
    held: WorldOrder | None = None  # the members' reform order, until its joiner is prepared

    def __post_init__(self):
        self.members = sorted(self.members)
        self.confirmed = list(self.members)

    def to_leader(self, cmd: Order) -> list[Tell]:
        """A command for every rank goes to the world's rank 0, the authority that offers it to
        each rank at an agreed step."""
        if not self.members:
            return []
        if isinstance(cmd, ChangeSettings):
            self.asked[cmd.request] = self.members[0]
        return [Tell(self.members[0], cmd)]

    def ask_again(self, unanswered: dict[str, dict]) -> list[Tell]:
        """Settings requests still unanswered by a leader that has left the world (stopped, or
        died with them in its pipe) go to the new leader; rank 0's answer names each."""
        self.asked = {rid: slot for rid, slot in self.asked.items() if rid in unanswered}
        again = [ChangeSettings(settings=settings, request=rid)
                 for rid, settings in unanswered.items()
                 if self.members and self.asked.get(rid, self.members[0]) not in self.members]
        return [tell for cmd in again for tell in self.to_leader(cmd)]

    # -- requests --------------------------------------------------------------------------
    def stop(self, slot: int, now: float) -> list:
        if self.change is not None:  # one change at a time: this one waits its turn
            self.deferred.append(("stop", slot))
            return []
        if slot not in self.members:
            return [Say(f"rank {slot} is not running", "warning")]
        if len(self.members) == 1:
            self.wanted.discard(slot)
            return [Say(f"rank {slot} is the last rank: q ends the run instead", "warning")]
        leader = self.members[0]  # the current world's rank 0 offers it to every rank
        order = self._order(Reform, [s for s in self.members if s != slot], now)
        self.leaving.add(slot)
        return [Tell(leader, order),
                Say(f"stopping rank {slot}: it leaves at the next agreed step, the other "
                    f"{count(len(order.members), 'rank')} go on")]

    def restart(self, slot: int, standby_alive: bool, now: float) -> list:
        """A stopped or crashed slot joins from its standby (now if warm, else once it is);
        a running one leaves first."""
        if self.change is not None:
            self.deferred.append(("restart", slot))
            return []
        running = slot in self.members
        self.wanted.add(slot)
        warming = not running and slot not in self.ready
        actions = [Say(f"restarting rank {slot}: it joins again from a warm standby"
                       + (" after leaving" if running else "")
                       + (" as soon as the standby is warm" if warming else ""))]
        if running:
            return actions + self.stop(slot, now)
        if not standby_alive:
            self.ready.discard(slot)
            actions.append(Standby(slot))
        return actions + self._next(now)

    # -- facts -----------------------------------------------------------------------------
    def standby_ready(self, slot: int, now: float) -> list:
        self.ready.add(slot)
        return self._next(now)

    def entered(self, slot: int) -> None:
        """The slot announced itself running in the world (being formed)."""
        self.out.pop(slot, None)
        if self.change is not None:
            self.announced.add(slot)

    def prepared(self, slot: int, now: float) -> list:
        """The joiner ran its script up to run.elastic(): the members form the world now."""
        if self.held is None or self.held.joiner != slot:
            return []
        order, self.held = self.held, None
        self.deadline = now + self.timeout
        return [Tell(self.confirmed[0], order)]

    def world_confirmed(self, generation: int, now: float) -> list:
        if self.change is None or generation != self.change.gen:
            return []
        self.change = None
        self.confirmed = list(self.members)
        for slot in self.confirmed:  # in the world now, whether or not its own report came in
            self.out.pop(slot, None)
        return self._next(now)

    def left(self, slot: int) -> list:
        """A leaving rank ended cleanly after the agreed step: its slot gets a standby."""
        self.leaving.discard(slot)
        self.out[slot] = (RankState.STOPPED, "left the world on request")
        return [Standby(slot)]

    def died(self, slot: int, alive: set[int], recoverable: bool, why: str, now: float,
             restart: bool = False) -> list:
        """A process of the slot died. A member's death re-forms the world from the members
        still alive (the joiner and a leaver of an unconfirmed change are not among them: they
        are ended and go back to standing by); a standby's death is only reported."""
        joiner = self.change.joiner if self.change else None
        if self.held is not None and slot == joiner:
            return self._join_called_off(slot, why, now)
        in_world = slot in self.members or slot in self.confirmed or slot in self.leaving
        if not in_world:
            self.ready.discard(slot)
            return [Say(f"standby for rank {slot} {why}; r starts another", "warning")]
        actions: list = []
        dropped = ({joiner} if joiner is not None else set()) | self.leaving
        for s in sorted(dropped - {slot}):
            if s in alive:
                actions.append(Kill(s, f"the world broke while rank {s} was "
                                       + ("joining" if s == joiner else "leaving")))
            if s == joiner:
                self.wanted.add(s)  # it joins again once a new standby is warm
            self.ready.discard(s)
            actions.append(Standby(s))
        self.leaving.clear()
        self.held = None
        base = self._member_slots()
        survivors = sorted((base & alive) - dropped - {slot})
        if not (recoverable and survivors):
            return [Fail(f"rank {slot} {why}")]
        self.ready.discard(slot)
        self.out[slot] = (RankState.CRASHED, why)
        order = self._order(Recover, survivors, now)
        actions += [Tell(s, order) for s in survivors]
        actions.append(Say(f"rank {slot} {why}: going on with {count(len(survivors), 'rank')} "
                           "from their last common step", "warning"))
        if restart:
            self.wanted.add(slot)
        actions.append(Standby(slot))
        return actions

    def halt_without(self, slots: list[int], alive: set[int], now: float) -> list:
        """A stop that cannot wait for `slots` (stalled, being killed): the other members
        re-form without them, go back to their last common point and stop there."""
        base = self._member_slots()
        survivors = sorted((base & alive) - set(slots) - self.leaving
                           - {self.change.joiner if self.change else None})
        if not survivors:
            return []
        order = self._order(Recover, survivors, now, stop=True)
        return [Tell(s, order) for s in survivors]

    def tick(self, now: float) -> list:
        """A change not confirmed in time: the members that did not enter are killed."""
        if self.change is None or now < self.deadline:
            return []
        late = [s for s in self.members if s not in self.announced]
        self.deadline = now + self.timeout  # their deaths re-form the world; no repeat meanwhile
        return [Kill(s, f"did not enter the new world within {self.timeout:.0f} s")
                for s in late]

    def idle(self) -> bool:
        return self.change is None

    # -- inside ----------------------------------------------------------------------------
    def _join_called_off(self, slot: int, why: str, now: float) -> list:
        """A joiner died in its script before the members were told: they go on untouched."""
        self.held = self.change = None
        self.members = list(self.confirmed)
        self.out[slot] = (RankState.CRASHED, why)
        actions = [Say(f"rank {slot} {why} before it joined: the others go on", "warning"),
                   *self._next(now)]
        return actions + [Standby(slot)]  # started only if an r asked for it meanwhile

    def _member_slots(self) -> set[int]:
        """The world's members, ordered or last confirmed, less those that crashed or left
        since: such a slot's live process is its standby, which no recover order may name."""
        return (set(self.members) | set(self.confirmed)) - set(self.out)

    def _order(self, kind: type[WorldOrder], members: list[int], now: float,
               in_order: bool = False, **extra) -> WorldOrder:
        """`members` in world-rank order; by slot unless `in_order`."""
        self.generation += 1
        order = kind(members=members if in_order else sorted(members), gen=self.generation,
                     init=self.new_address(), **extra)
        self.members = order.members
        self.change = order
        self.deadline = now + self.timeout
        self.announced = set()
        return order

    def _next(self, now: float) -> list:
        """After a change: the next asked-for stop or restart, or a wanted slot's join."""
        actions: list = []
        while self.change is None and self.deferred:
            op, slot = self.deferred.pop(0)
            actions += self.stop(slot, now) if op == "stop" else self.restart(slot, True, now)
        if self.change is not None or not self.members:
            return actions
        ready = [s for s in sorted(self.wanted) if s in self.ready and s not in self.members]
        if not ready:
            return actions
        slot, leader = ready[0], self.members[0]
        self.wanted.discard(slot)
        self.ready.discard(slot)
        if self.prepared_joins:  # last: never rank 0, whose init_process_group opens a store
            order = self._order(Reform, self.members + [slot], now, in_order=True,
                                joiner=slot, prepare=True)
            self.held, self.deadline = order, float("inf")  # its script takes what it takes
            return actions + [Tell(leader, _as(Host, order)), Tell(slot, _as(Join, order)),
                              Joining(slot)]
        order = self._order(Reform, self.members + [slot], now, joiner=slot)
        return actions + [Tell(leader, order), Tell(slot, _as(Join, order)), Joining(slot)]


def _as(kind: type[WorldOrder], order: WorldOrder) -> WorldOrder:
    """The same change, as an order of another kind (a join for the joiner)."""
    return kind(**{f.name: getattr(order, f.name) for f in dataclasses.fields(order)})
