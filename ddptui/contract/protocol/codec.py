"""The one codec: a message to one JSON line and back, for the JSONL log, the ranks' pipes and
channel, and the dashboards' socket; a decoded message is checked against its class (a value of
the wrong type, a required field missing: not a message). Logs written by earlier releases read
back too: what rode in a `message` event then is the kind of its own it is now.

The only module that touches JSON or pickle: whatever crosses a process or reaches a file
passes here.
"""

from __future__ import annotations

import io
import json
import math
import pickle
from typing import Any

from ddptui.contract.protocol import relay, steptime  # noqa: F401  (register their events)
from ddptui.contract.protocol.events import EVENTS, Event
from ddptui.contract.protocol.orders import ORDERS, Order
from ddptui.contract.protocol.updates import UPDATES, Update
from ddptui.contract.protocol.wire import Wire


def encode(msg: Wire | dict) -> str:
    """One JSON line; NaN/inf (a diverged loss) become null so the line stays valid JSON."""
    obj = msg.fields() if isinstance(msg, Wire) else msg
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in obj.items()}
    return json.dumps(clean, separators=(",", ":")) + "\n"


def parse(text: str | bytes) -> dict | None:
    """A JSON object, or None for anything else (not JSON, a list, a number)."""
    obj = json_value(text)
    return obj if isinstance(obj, dict) else None


def json_value(text: str | bytes) -> Any:
    """Any JSON value (a browser page's messages are lists), or None where it is not JSON. NaN
    and Infinity, which Python's JSON reads and no other does, are null: never a figure."""
    try:
        return json.loads(text, parse_constant=lambda _name: None)
    except (ValueError, RecursionError):
        return None


def decode(line: str | bytes) -> Event | None:
    """A log line's event; None for a blank, malformed or foreign line."""
    obj = parse(line)
    return None if obj is None else event_of(obj)


def event_of(obj: dict) -> Event | None:
    built = EVENTS.build(_as_now(obj) if obj.get("kind") == "message" else obj)
    return built if isinstance(built, Event) else None


def order_of(obj: dict | None) -> Order | None:
    built = ORDERS.build(obj) if obj is not None else None
    return built if isinstance(built, Order) else None


def update_of(obj: dict | None) -> Update | None:
    built = UPDATES.build(obj) if obj is not None else None
    return built if isinstance(built, Update) else None


def message_of(text: str | bytes) -> Event | Order | None:
    """What a rank or a dashboard link carries: an event or an order."""
    obj = parse(text)
    if obj is None:
        return None
    return event_of(obj) if "kind" in obj else order_of(obj)


# A `message` of an earlier release carried these facts beside its text: the kind that holds
# them now, by the field that tells it.
_SPLIT = (("stacks_of", "stacks"), ("input_wait", "input_wait"), ("bad_sample", "bad_sample"),
          ("usage", "usage"), ("change_s", "world_cost"), ("redone", "rollback"),
          ("autotune", "autotune"))
_FACTS = ("num_classes", "num_train", "steps_per_epoch", "params", "epochs", "world_size",
          "global_step", "decoder")


def _as_now(obj: dict) -> dict:
    for name, kind in _SPLIT:
        if name in obj:
            if kind == "stacks":
                return {"stacks": "", **obj, "kind": kind}
            return {**obj, "kind": kind}
    if any(name in obj for name in _FACTS):
        return {**obj, "kind": "facts"}
    return obj


def dumps(obj: Any, indent: int | None = None) -> str:
    """A record of ddptui's own as JSON text (a run's record, a rank's hello, a report)."""
    return json.dumps(obj, indent=indent)


def pack(obj: Any) -> bytes:
    """A rank's own training state for a peer of its world (a joiner's), as bytes: its state
    dict holds what only pickle carries, and it crosses between a run's own ranks alone."""
    return pickle.dumps(obj)


def unpack(data: bytes) -> Any:
    return pickle.loads(data)  # a member's own state, over the world's links


# torch writes its flight recorder's dump with its own pickler, which wraps typed lists in calls
# of torch.jit._pickle; they only give the value back, so they are read here without torch.
_TORCH_LISTS = {"build_intlist", "build_doublelist", "build_boollist", "build_genericlist",
                "build_tensorlist", "restore_type_tag"}
_BUILTINS = {"list": list, "dict": dict, "tuple": tuple, "set": set, "frozenset": frozenset}


def _same(value, *_type_tag):
    return value


class _Plain(pickle.Unpickler):
    """The dump is plain data (dicts, lists, strings, numbers): nothing else is loaded."""

    def find_class(self, module: str, name: str):
        if module == "torch.jit._pickle" and name in _TORCH_LISTS:
            return _same
        if module == "builtins" and name in _BUILTINS:
            return _BUILTINS[name]
        raise pickle.UnpicklingError(f"not plain data: {module}.{name}")


def plain_data(data: bytes) -> object | None:
    """What a pickle of plain data (torch's NCCL flight recorder dump: dicts, lists, strings,
    numbers) holds; None for one that is not, or not whole (nothing else is loaded)."""
    try:
        return _Plain(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError):
        return None
