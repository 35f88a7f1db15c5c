"""The event a node's relay opens its link to `ddptui attach` with: from then on that one
connection carries every rank of its node (ddptui/rank/wrap/relay.py). Registered in the
events' family (events.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptui.contract.protocol.events import EVENTS, Event
from ddptui.contract.protocol.wire import doc


@EVENTS.register("relay")
@dataclass(frozen=True, kw_only=True, slots=True)
class Relay(Event):
    """A node's relay, first on each connection it makes to `ddptui attach` (rank -1), and again
    when ranks hang up on it: the events that follow on it are its node's ranks', and orders for
    them go back on it with `to` set.
    When it is lost, attach says its ranks unreachable until they connect again directly. Not
    written to the log."""

    pid: int = doc("the relay's process")
    left: list | None = doc("ranks that hung up on the relay since: their orders no longer go "
                            "through it", None)
