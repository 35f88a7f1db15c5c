"""What a run's process sends each dashboard on its socket, one frozen dataclass a type: the run
as it is when the dashboard connects, each change to it as it happens, the end last.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptui.contract.protocol.wire import Family, Wire, doc

UPDATES = Family("type")


@dataclass(frozen=True, kw_only=True, slots=True)
class Update(Wire):
    """One JSON object a line: `hello` first, then each change to the run state as it happens,
    `end` last."""


@UPDATES.register("hello")
@dataclass(frozen=True, kw_only=True, slots=True)
class Hello(Update):
    """The run as it is when the dashboard connects."""

    name: str = doc("the run's name (its log's, without .jsonl)")
    pid: int = doc("the run's process")
    log: str = doc("its log")
    snapshot: dict = doc("the run state, every field (ddptui/contract/state/snapshot.py)")


@UPDATES.register("event")
@dataclass(frozen=True, kw_only=True, slots=True)
class Applied(Update):
    """An event the run's state took, as in the log (or not logged: a key's note)."""

    ev: dict = doc("the event")


@UPDATES.register("say")
@dataclass(frozen=True, kw_only=True, slots=True)
class Said(Update):
    """A line of the events pane that is not an event."""

    text: str = doc("the line")
    level: str = doc("info, warning or error")
    t: float = doc("unix time")


@UPDATES.register("host")
@dataclass(frozen=True, kw_only=True, slots=True)
class HostReadings(Update):
    """The machine's CPU and memory readings (a CPU run's panel)."""

    host: dict = doc("the readings")


@UPDATES.register("end")
@dataclass(frozen=True, kw_only=True, slots=True)
class End(Update):
    """The run ended; the socket closes after it."""

    exit_code: int | None = doc("the run's exit code")
