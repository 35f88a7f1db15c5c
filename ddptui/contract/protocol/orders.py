"""Every order, one frozen dataclass an op: a dashboard's key to a run's own process, the run's
commands to its ranks (offered by the world's rank 0 to every rank at an agreed step), the world
orders of a change of members, and attach's orders to a wrapped rank's sidecar.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ddptui.contract.protocol.events import PARENT, SETTINGS, Settings
from ddptui.contract.protocol.wire import Family, Wire, doc

ORDERS = Family("op")


@dataclass(frozen=True, kw_only=True, slots=True)
class Order(Wire):
    """A dashboard's key becomes one order for the run's own process, which carries it out as its
    own key would (a dashboard's at most 64 KiB, one JSON object a line on the run's socket);
    those for the ranks go to the world's rank 0, which offers them to every rank at an agreed
    step. A dashboard's order that is not one of these, with these fields, is refused: a line
    in the events for each of a dashboard's first 10 in 10 s, the rest summed up in one, and a
    dashboard with 100 refused in 10 s is closed."""

    to: int | None = doc("attach to a node's relay: the rank the order is for (the relay passes "
                         "it to that rank alone)", None)


@ORDERS.register("pause")
@dataclass(frozen=True, kw_only=True, slots=True)
class Pause(Order):
    """space: every rank holds at the same step (`run` paused)."""


@ORDERS.register("resume")
@dataclass(frozen=True, kw_only=True, slots=True)
class Resume(Order):
    """space again: every rank goes on (`run` resumed)."""


@ORDERS.register("checkpoint")
@dataclass(frozen=True, kw_only=True, slots=True)
class TakeCheckpoint(Order):
    """c: every rank checkpoints at the same step (the built-in trainer writes with
    --checkpoint-dir; a script's `run.should_checkpoint`)."""


@ORDERS.register("apply")
@dataclass(frozen=True, kw_only=True, slots=True)
class Apply(Order):
    """a: pending settings apply at the next agreed step."""


@ORDERS.register("read_only")
@dataclass(frozen=True, kw_only=True, slots=True)
class ReadOnly(Order):
    """A dashboard's first order where it may only watch (a browser tab of `ddptui web` without
    --control): the run refuses every order after it but `stacks` (asking is watching)."""


@ORDERS.register("stop")
@dataclass(frozen=True, kw_only=True, slots=True)
class Stop(Order):
    """q then y, Ctrl-C, SIGTERM: the ranks stop at an agreed step and the run ends as ddptui's
    own would (to the ranks: the order alone)."""

    code: int | None = doc("the exit code the run ends with: 130 (q, Ctrl-C), 143 (SIGTERM)",
                           None)
    status: str | None = doc("the run's end status (interrupted, failed)", None)
    reason: str | None = doc("why", None)


@ORDERS.register("settings")
@dataclass(frozen=True, kw_only=True, slots=True)
class ChangeSettings(Order):
    """p, w, W, b: new input-pipeline settings from the next epoch."""

    settings: dict = doc(SETTINGS)
    request: str = doc("the request's id, named by rank 0's `pending` answer (a dashboard "
                       "chooses it: its screen shows the change pending at once)")


@dataclass(frozen=True, kw_only=True, slots=True)
class RankOrder(Order):
    """s, r, k, t on the selected rank."""

    rank: int = doc("the rank slot")


@ORDERS.register("stop_rank")
@dataclass(frozen=True, kw_only=True, slots=True)
class StopRank(RankOrder):
    """s: the rank leaves at the next agreed step."""


@ORDERS.register("restart_rank")
@dataclass(frozen=True, kw_only=True, slots=True)
class RestartRank(RankOrder):
    """r: the rank joins again (a running one leaves first)."""


@ORDERS.register("kill_rank")
@dataclass(frozen=True, kw_only=True, slots=True)
class KillRank(RankOrder):
    """k: the rank is killed."""


@ORDERS.register("stacks")
@dataclass(frozen=True, kw_only=True, slots=True)
class AskStacks(RankOrder):
    """t: the rank's Python stacks (to a wrapped rank's sidecar: its own, `rank` its slot)."""


@ORDERS.register("restart_group")
@dataclass(frozen=True, kw_only=True, slots=True)
class RestartGroup(Order):
    """s, r, k on a script's rank without run.elastic(): every rank ends and the group starts
    again."""

    kill: int | None = doc("a rank to SIGKILL at once (k)")


@ORDERS.register("kill")
@dataclass(frozen=True, kw_only=True, slots=True)
class KillWrapped(Order):
    """attach's k, to a wrapped rank's sidecar (`python -m ddptui.wrap`): SIGKILL at once; the
    rank's launcher does the rest."""


@ORDERS.register("end")
@dataclass(frozen=True, kw_only=True, slots=True)
class EndWrapped(Order):
    """attach's K, the whole job, to each wrapped rank's sidecar: SIGTERM, SIGKILL after
    `grace`."""

    grace: float | None = doc("seconds from the SIGTERM to the SIGKILL", None)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorldOrder(Order):
    """A change of the world, decided by the run's process alone (ddptui/run/membership.py) and
    sent to ranks' command pipes (a script's under run.elastic(): its report channel)."""

    members: list = doc("the slots of the new world, in world-rank order")
    gen: int = doc("the world's generation (how many times it has formed)")
    init: str = doc("the new process group's rendezvous address, tcp://HOST:PORT")
    joiner: int | None = doc("reform and join: the slot that joins", None)
    prepare: bool | None = doc("reform and join, a script's: the joiner (last in `members`) "
                               "runs its script up to run.elastic() first; the reform goes to "
                               "rank 0 once it is `prepared`", None)
    stop: bool | None = doc("recover: the survivors checkpoint and end (a quit with a stalled "
                            "rank)", None)


@ORDERS.register("reform")
@dataclass(frozen=True, kw_only=True, slots=True)
class Reform(WorldOrder):
    """To the world's rank 0, which offers it to every member at an agreed step: a leave or a
    join."""


@ORDERS.register("join")
@dataclass(frozen=True, kw_only=True, slots=True)
class Join(WorldOrder):
    """To the joining standby."""


@ORDERS.register("recover")
@dataclass(frozen=True, kw_only=True, slots=True)
class Recover(WorldOrder):
    """Straight to every survivor after a rank died: they roll back and re-form without it."""


@ORDERS.register("host")
@dataclass(frozen=True, kw_only=True, slots=True)
class Host(WorldOrder):
    """To the world's rank 0 as a script's joiner is told to join: the new world's store listens
    at once, for the joiner's script to connect to."""


# What a dashboard may send a run's process (the rest are the run's own, or to its ranks).
FROM_DASHBOARDS = (Pause, Resume, TakeCheckpoint, Apply, ReadOnly, Stop, ChangeSettings, StopRank,
                   RestartRank, KillRank, AskStacks, RestartGroup)


def settings_request(settings: dict, rid: str | None = None) -> tuple[Settings, ChangeSettings]:
    """A settings change as the parent's own "requested" event and the order for rank 0, under
    one id (`rid`, or a new one): rank 0's "pending" echo names it, so a view can tell an echo
    that later keys overtook."""
    rid = rid or uuid.uuid4().hex[:8]
    return (Settings(rank=PARENT, settings=settings, status="requested", request=rid),
            ChangeSettings(settings=settings, request=rid))
