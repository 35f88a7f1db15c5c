"""What `ddptui attach --listen` keeps beside its log (`<log>.state.json`, every few seconds and
at its end): the run state and attach's own bookkeeping, so that an attach restarted on the same
log draws the job at once instead of starting empty or folding a day of events again.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field

from ddptui.contract.protocol.codec import event_of
from ddptui.contract.protocol.events import Rank
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.snapshot import dump, load

SAVE_EVERY_S = 10.0  # what a crashed attach loses of the screen; the log keeps every event
MAX_BYTES = 256 << 20  # a kept state is a few MB at 1,024 ranks: past this it is not one of ours
VERSION = 1
KEPT_GPU_S = 60.0  # of each GPU's readings: the `g` screen's five minutes fill up again
FINAL = ("done", "failed", "interrupted")  # a job that ended: a new one starts afresh


@dataclass
class Kept:
    """A kept state, read back: the run state and what attach knew of the job's ranks."""

    state: RunState
    saved_t: float
    world_size: int | None = None
    finished: bool = False
    ends: dict[int, Rank] = field(default_factory=dict)  # rank -> the event of its end
    wrapped: list[int] = field(default_factory=list)  # ranks under python -m ddptui.wrap
    places: dict[int, str] = field(default_factory=dict)  # rank -> "node vm2, local 1"
    log_start: float | None = None  # the log's first event: its first minutes are kept whole


def path_of(log_path: str) -> str:
    return f"{os.path.splitext(log_path)[0]}.state.json"


def save(log_path: str, state: RunState, attach: dict) -> int:
    """Write the state and `attach`'s fields whole or not at all (a new file renamed over the
    old one); the caller holds attach's lock, so the log's size matches the state. Its bytes."""
    with state.lock:  # (the dump holds some of the state's own lists: encoded under the lock)
        kept = dump(state)
        for device in kept["devices"]:
            rows = device["history"]["rows"]
            device["history"]["rows"] = [r for r in rows if r[0] >= rows[-1][0] - KEPT_GPU_S]
        data = json.dumps({"version": VERSION, "saved_t": time.time(),
                           "log_size": os.path.getsize(log_path), **attach,
                           "state": kept}, separators=(",", ":")).encode()
    path = path_of(log_path)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return len(data)


def restore(log_path: str) -> tuple[Kept | None, str]:
    """The kept state of `log_path`'s job where it is still going, or None and why not ("" where
    none was kept). It came from a file: each part is checked, and none of it can raise."""
    path = path_of(log_path)
    try:
        if os.path.getsize(path) > MAX_BYTES:
            return None, f"{path} is over {MAX_BYTES >> 20} MB: not a state of ddptui's"
        with open(path, "rb") as f:
            data = json.loads(f.read())
        log_size = os.path.getsize(log_path)
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as e:
        return None, f"cannot read {path}: {getattr(e, 'strerror', None) or e}"
    try:
        return _kept(data, log_size, path)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        return None, f"{path} is not a state ddptui can read ({type(e).__name__}: {e})"


def _kept(data: dict, log_size: int, path: str) -> tuple[Kept | None, str]:
    if data["version"] != VERSION:
        return None, f"{path} was kept by another version of ddptui"
    if log_size < data["log_size"]:  # the log was cut or replaced: the state is not its
        return None, f"{path} is of a longer log than {log_size:,} bytes: not this one's"
    state = load(data["state"])
    if state.status in FINAL:
        return None, ""  # that job ended: the log goes on with the next one
    ends = {int(r): event_of(fields) for r, fields in data["ends"]}
    return Kept(state, float(data["saved_t"]), data["world_size"], bool(data["finished"]),
                {r: e for r, e in ends.items() if isinstance(e, Rank)},
                [int(r) for r in data["wrapped"]],
                {int(r): str(p) for r, p in data["places"]},
                data["log_start"]), ""


def fields_of(world_size: int | None, finished: bool, ends: dict[int, Rank],
              wrapped: list[int], places: dict[int, str], log_start: float | None) -> dict:
    """Attach's part of a kept state, as `save` takes it."""
    return {"world_size": world_size, "finished": finished,
            "ends": [[r, e.fields()] for r, e in ends.items()], "wrapped": sorted(wrapped),
            "places": [[r, p] for r, p in places.items()], "log_start": log_start}
