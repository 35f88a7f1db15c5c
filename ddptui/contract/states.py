"""The states a rank slot is shown in, and the groups of them the screens and the supervisors ask
about: the `state` of `rank` events, read by every process."""

from __future__ import annotations

import enum


class RankState(str, enum.Enum):  # noqa: UP042 (its str() is kept as it was)
    """Every state a rank slot is shown in (the `state` of `rank` events), and the groups of
    states the screens and the supervisor ask about."""

    STARTING = "starting"
    RUNNING = "running"
    STANDBY = "standby"  # warmed up outside the world, ready to join
    STOPPED = "stopped"  # left the world on request (its standby is a detail)
    CRASHED = "crashed"  # died; the others went on without it
    RESTARTING = "restarting"  # joining the world
    STALLED = "stalled"  # a member that finished no step for --stall-after seconds
    WAITING = "waiting"  # a member blocked on a stalled one
    SLOW = "slow"  # a straggler: 15% slower than the others
    UNREACHABLE = "unreachable"  # attach: a rank that stopped reporting (stopped, node, link)
    DONE = "done"

    __str__ = str.__str__  # "running", in f-strings and tables alike
    __format__ = str.__format__  # type: ignore[assignment]  # the value's, not Enum's

    @classmethod
    def of(cls, value: str) -> RankState:
        """The state a `rank` event names; a name this version does not know reads as running
        (a newer writer's state of a live rank)."""
        try:
            return cls(value)
        except ValueError:
            return cls.RUNNING

    @property
    def is_member(self) -> bool:
        """In the world: stepping, or held up inside it (killing it leaves the others short)."""
        return self in (RankState.RUNNING, RankState.SLOW, RankState.STALLED, RankState.WAITING,
                        RankState.UNREACHABLE)

    @property
    def is_stepping(self) -> bool:
        """Finishing steps: its step figures are current."""
        return self in (RankState.RUNNING, RankState.SLOW)

    @property
    def is_troubled(self) -> bool:
        """A member the others wait for or on, or a straggler: the console names it."""
        return self in (RankState.STALLED, RankState.WAITING, RankState.SLOW,
                        RankState.UNREACHABLE)

    @property
    def is_final(self) -> bool:
        """Its process has ended (a stopped or crashed slot may be started again)."""
        return self in (RankState.DONE, RankState.CRASHED, RankState.STOPPED)

    @property
    def is_coming(self) -> bool:
        """Starting or joining: a restart asked now would overtake itself."""
        return self in (RankState.STARTING, RankState.RESTARTING)

    @property
    def can_rejoin(self) -> bool:
        """Out of the world with a slot to come back to."""
        return self in (RankState.STOPPED, RankState.CRASHED)
