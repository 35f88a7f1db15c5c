"""What the run's deciders (membership.py, the built-in loop's watchdog) ask the run's thread to
do: they return these and start, kill, send and print nothing themselves; OwnedRun._act carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptui.contract.protocol.events import Event
from ddptui.contract.protocol.orders import Order
from ddptui.run.outcome import EXIT_FAILED


@dataclass(frozen=True)
class Tell:
    """Send `order` to the slot's current process (a reform to the leader, urgent ones direct)."""

    slot: int
    order: Order


@dataclass(frozen=True)
class Say:
    """A message of the run's own: a line in the log and the event pane."""

    text: str
    level: str = "info"


@dataclass(frozen=True)
class Record:
    """An event of the run's own that says more than a line (a rank's stacks)."""

    event: Event


@dataclass(frozen=True)
class Kill:
    """End the slot's process now (the others recover without it)."""

    slot: int
    why: str


@dataclass(frozen=True)
class Fail:
    """The run is lost: every process ends, and ddptui exits with `code`."""

    reason: str
    code: int = EXIT_FAILED


@dataclass(frozen=True)
class Standby:
    """Start a warm standby for the slot (it is out of the world)."""

    slot: int


@dataclass(frozen=True)
class Joining:
    """The slot's standby was told to join: it is restarting."""

    slot: int


@dataclass(frozen=True)
class Flag:
    """Show the slot in a health state (stalled, waiting, slow, running again) and why."""

    slot: int
    state: str
    reason: str
    fields: dict = field(default_factory=dict)  # the verdict's figures, as its `rank` event names them


Action = Tell | Say | Record | Kill | Fail | Standby | Joining | Flag
