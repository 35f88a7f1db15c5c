"""What `ddptui attach --listen` keeps beside its log (`<log>.state.json`, every few seconds and
at its end): the run state and attach's own bookkeeping, so that an attach restarted on the same
log draws the job at once instead of starting empty or folding a day of events again.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from dataclasses import dataclass, field, fields

from ddptui.contract.protocol.codec import dumps, event_of, parse
from ddptui.contract.protocol.events import Rank
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.snapshot import PLAIN, dump, load
from ddptui.contract.state.views import DeviceView, RankView

SAVE_EVERY_S = 10.0  # what a crashed attach loses of the screen; the log keeps every event
MAX_BYTES = 64 << 20  # a kept state is some 6 MB at 512 ranks: past this it is not one of ours
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


def encoded(log_path: str, state: RunState, attach: dict) -> bytes:
    """The state and `attach`'s fields as the file's bytes; the caller holds attach's lock, so
    the log's size matches the state (the dump holds some of the state's own lists, so it is
    encoded under the state's lock too)."""
    with state.lock:
        kept = dump(state)
        for device in kept["devices"]:
            rows = device["history"]["rows"]
            device["history"]["rows"] = [r for r in rows if r[0] >= rows[-1][0] - KEPT_GPU_S]
        return dumps({"version": VERSION, "saved_t": time.time(),
                      "log_size": os.path.getsize(log_path), **attach, "state": kept}).encode()


def write(log_path: str, data: bytes) -> None:
    """Whole or not at all: a new file renamed over the old one."""
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


def restore(log_path: str) -> tuple[Kept | None, str]:
    """The kept state of `log_path`'s job where it is still going, or None and why not ("" where
    none was kept). It came from a file: it is read only where it is a file of bounded size,
    each part is checked, and nothing in it can raise."""
    path = path_of(log_path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a FIFO there would block an open)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None, f"{path} is not a file"
            raw = f.read(MAX_BYTES + 1)
        log_size = os.path.getsize(log_path)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror or e}"
    if len(raw) > MAX_BYTES:
        return None, f"{path} is over {MAX_BYTES >> 20} MB: not a state of ddptui's"
    data = parse(raw)
    if data is None:
        return None, f"{path} is not a state ddptui can read (not a JSON object)"
    try:
        return _kept(data, log_size, path)
    except Exception as e:  # noqa: BLE001 (a file's content: whatever it holds, attach starts)
        return None, f"{path} is not a state ddptui can read ({type(e).__name__}: {e})"


def _kept(data: dict, log_size: int, path: str) -> tuple[Kept | None, str]:
    if data["version"] != VERSION:
        return None, f"{path} was kept by another version of ddptui"
    if log_size < data["log_size"]:  # the log was cut or replaced: the state is not its
        return None, f"{path} is of a longer log than {log_size:,} bytes: not this one's"
    state = load(data["state"])
    _typed(state)
    if state.status in FINAL:
        return None, ""  # that job ended: the log goes on with the next one
    ends = {int(r): event_of(fields) for r, fields in data["ends"]}
    kept = Kept(state, _moment(data["saved_t"]), _whole(data["world_size"]),
                data["finished"] is True, {r: e for r, e in ends.items() if isinstance(e, Rank)},
                [int(r) for r in data["wrapped"]], {int(r): str(p) for r, p in data["places"]},
                None if data["log_start"] is None else _moment(data["log_start"]))
    state.view(), state.charts()  # what the screen asks of it first: raises here if it would
    return kept, ""


def _typed(state: RunState) -> None:
    """Each field of the kept state, its ranks and devices of the type a new one holds there."""
    _like(state, RunState(), PLAIN)
    for name in ("started_t", "first_step_t", "ended_t", "last_t", "checkpoint_t"):
        if getattr(state, name):
            _moment(getattr(state, name))
    for r in state.ranks.values():
        _like(r, RankView(0), [f.name for f in fields(RankView)])
    for d in state.devices.values():
        _like(d, DeviceView("", 0), [f.name for f in fields(DeviceView)])


def _like(kept, fresh, names) -> None:
    for name in names:
        value, like = getattr(kept, name), getattr(fresh, name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if like is None and not (value is None or number or isinstance(value, (bool, str))) \
                or like is not None and not isinstance(value, type(like)) \
                and not (isinstance(like, float) and number):
            raise TypeError(f"its {type(kept).__name__}.{name} is a {type(value).__name__}")


def _moment(t) -> float:
    """A time in seconds since the epoch that a clock can show."""
    if not isinstance(t, (int, float)) or not 0 < t < 1e11:
        raise ValueError(f"{t!r} is not a time")
    return float(t)


def _whole(n) -> int | None:
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 0 < n < 1 << 31):
        raise ValueError(f"{n!r} is not a number of ranks")
    return n


def afresh(state: RunState, meta: dict) -> None:
    """A new job began on a log whose kept job had ended unseen: the same state object (the
    screen and the metrics hold it) made a new one's with `meta`, keeping its lock."""
    with state.lock:
        lock = state.lock
        state.__dict__.update(RunState(meta).__dict__)
        state.lock = lock


def fields_of(world_size: int | None, finished: bool, ends: dict[int, Rank],
              wrapped: list[int], places: dict[int, str], log_start: float | None) -> dict:
    """Attach's part of a kept state, as `encoded` takes it."""
    return {"world_size": world_size, "finished": finished,
            "ends": [[r, e.fields()] for r, e in ends.items()], "wrapped": sorted(wrapped),
            "places": [[r, p] for r, p in places.items()], "log_start": log_start}
