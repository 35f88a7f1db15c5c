"""What crosses a run's socket (contract/viewers.py): a dashboard's orders and the run's updates,
as TypedDicts (docs/events.md is made from them), and the check every order passes.
"""

# No `from __future__ import annotations`: get_type_hints reads these classes' fields.
from types import UnionType
from typing import Annotated, TypedDict, Union, get_args, get_origin, get_type_hints

from ddptui.contract.schema import Settings


class ViewerOrder(TypedDict):
    """A dashboard's order to a run's own process, one JSON object a line on the run's Unix
    socket (docs/dashboard.md), at most 64 KiB. A key becomes one order, and the run carries it
    out as its own key would; a message that is not one of these, with these fields, is refused:
    a line in the events for each of a dashboard's first 10 in 10 s, the rest summed up in one,
    and a dashboard with 100 refused in 10 s is closed. `pause`, `resume`, `checkpoint` and
    `apply` carry nothing more; nor does `read_only`, a dashboard's first order where it may
    only watch (a browser tab of `ddptui web` without --control): the run refuses every order
    after it but `stacks` (asking is watching)."""

    op: Annotated[str, "one of the ops below"]


class ViewerSettingsOrder(ViewerOrder):
    """p, w, W, b: new input-pipeline settings from the next epoch."""

    settings: Settings
    request: Annotated[str, "the request's id, chosen by the dashboard (its screen shows the "
                            "change pending at once)"]


class ViewerRankOrder(ViewerOrder):
    """s, r, k, t on the selected rank."""

    rank: Annotated[int, "the rank slot"]


class ViewerRestartOrder(ViewerOrder):
    """s, r, k on a script's rank without run.elastic(): every rank ends and the group starts
    again."""

    kill: Annotated[int | None, "a rank to SIGKILL at once (k)"]


class ViewerStopOrder(ViewerOrder):
    """q then y, or Ctrl-C or SIGTERM to a dashboard: the run ends as ddptui's own would."""

    code: Annotated[int, "the exit code the run ends with: 130 (q, Ctrl-C), 143 (SIGTERM)"]


VIEWER_ORDERS: dict[str, type] = {
    "pause": ViewerOrder, "resume": ViewerOrder, "checkpoint": ViewerOrder, "apply": ViewerOrder,
    "read_only": ViewerOrder,
    "settings": ViewerSettingsOrder, "stop_rank": ViewerRankOrder,
    "restart_rank": ViewerRankOrder, "kill_rank": ViewerRankOrder, "stacks": ViewerRankOrder,
    "restart_group": ViewerRestartOrder, "stop": ViewerStopOrder,
}


class RunUpdate(TypedDict):
    """What a run's process sends each dashboard, one JSON object a line: `hello` first, then
    each change to the run state as it happens, `end` last."""

    type: Annotated[str, "one of the types below"]


class HelloUpdate(RunUpdate):
    """The run as it is when the dashboard connects."""

    name: Annotated[str, "the run's name (its log's, without .jsonl)"]
    pid: Annotated[int, "the run's process"]
    log: Annotated[str, "its log"]
    faces: Annotated[dict, "what the keys may do now (see `faces`)"]
    snapshot: Annotated[dict, "the run state, every field (ddptui/contract/state/snapshot.py)"]


class EventUpdate(RunUpdate):
    """An event the run's state took, as in the log (or not logged: a key's note)."""

    ev: Annotated[dict, "the event"]


class SayUpdate(RunUpdate):
    """A line of the events pane that is not an event."""

    text: Annotated[str, "the line"]
    level: Annotated[str, "info, warning or error"]
    t: Annotated[float, "unix time"]


class HostUpdate(RunUpdate):
    """The machine's CPU and memory readings (a CPU run's panel)."""

    host: Annotated[dict, "the readings"]


class FacesUpdate(RunUpdate):
    """What the keys may do changed (a script's ranks opted in to a control)."""

    faces: Annotated[dict, "can_steer, refuse (why pause, settings or checkpoint cannot act, "
                           "by action), restarts_group (whether s, r, k act on every rank), "
                           "after_kill (what follows k on one rank, in words)"]


class EndUpdate(RunUpdate):
    """The run ended; the socket closes after it."""

    exit_code: Annotated[int | None, "the run's exit code"]


RUN_UPDATES: dict[str, type] = {
    "hello": HelloUpdate, "event": EventUpdate, "say": SayUpdate, "host": HostUpdate,
    "faces": FacesUpdate, "end": EndUpdate,
}


def _runtime(hint) -> tuple[type, ...]:
    """The types a JSON value of a schema field may have (Annotated and unions unwrapped)."""
    if get_origin(hint) is Annotated:
        return _runtime(get_args(hint)[0])
    if get_origin(hint) in (Union, UnionType):
        return tuple(t for arg in get_args(hint) for t in _runtime(arg))
    return (hint,)


# op -> each field it carries and the types it may have (schema.py); anything else is dropped.
ORDERS = {op: {name: _runtime(hint) for name, hint in
               get_type_hints(cls, include_extras=True).items() if name != "op"}
          for op, cls in VIEWER_ORDERS.items()}
SETTINGS = {"prefetch": bool, "workers": int, "cudnn_benchmark": bool}


def malformed(order: dict | None) -> str | None:
    """Why a viewer's message is not an order this run takes, or None when it is one."""
    if order is None:
        return "not a JSON object"
    op = order.get("op")
    fields = ORDERS.get(op) if isinstance(op, str) else None
    if fields is None:
        return f"unknown op {str(op)[:40]!r}"
    for name, kind in fields.items():
        value = order.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):  # no field is a flag
            return f"{order['op']}: bad {name}"
    settings = order.get("settings", {})
    if any(type(v) is not SETTINGS.get(k) for k, v in settings.items()):
        return "settings: unknown name or bad value"
    return None
