"""The telemetry event schema shared by the ranks (trainer/) and the parent (ddptui/).

Events are plain JSON-safe dicts; every one has "t" (unix time), "kind" and "rank" (-1: the parent).
Every kind's fields and their meaning: schema.py (docs/events.md is made from it).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import math
import os
import time
import uuid

from ddptui.contract.schema import EVENTS


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
    __format__ = str.__format__

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


PARENT = -1


def event(kind: str, rank: int, **fields) -> dict:
    """A new event stamped with the current time."""
    return {"t": round(time.time(), 3), "kind": kind, "rank": rank, **fields}


def settings_request(settings: dict, rid: str | None = None) -> tuple[dict, dict]:
    """A settings change as the parent's own "requested" event and the command for rank 0, under
    one id (`rid`, or a new one): rank 0's "pending" echo names it, so a view can tell an echo
    that later keys overtook."""
    rid = rid or uuid.uuid4().hex[:8]
    return (event("settings", PARENT, settings=settings, status="requested", request=rid),
            {"op": "settings", "settings": settings, "request": rid})


def encode(ev: dict) -> str:
    """One JSONL line; NaN/inf (a diverged loss) become null so the line stays valid JSON."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in ev.items()}
    return json.dumps(clean, separators=(",", ":")) + "\n"


def decode(line: str) -> dict | None:
    """Parse one line; None for a blank, malformed or foreign line."""
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    if not isinstance(ev, dict) or ev.get("kind") not in EVENTS \
            or not isinstance(ev.get("rank"), int) or not isinstance(ev.get("t", 0), (int, float)):
        return None
    return ev


class JsonlWriter:
    """Appends events to a file; each line is one write() on an O_APPEND descriptor, so several
    ranks of a torchrun launch can share one log without tearing lines."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.failed: str | None = None  # why a line could not be written, once one could not

    def write(self, ev: dict, last: bool = False) -> bool:
        """Append `ev` as one whole line; False where it could not be (a full disk): nothing of
        it is left in the file, and the log takes no more lines after that, but a `last` one
        (the run's end, where it still fits)."""
        if self.failed and not last:
            return False
        data = encode(ev).encode()
        size = -1
        try:
            size = os.fstat(self._fd).st_size
            if os.write(self._fd, data) == len(data):
                return True
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # cut short: the disk filled
        except OSError as e:
            self.failed = self.failed or e.strerror or str(e)
            if size >= 0:  # no torn line: the file ends with the last whole one
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, size)
            return False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_events(path: str) -> list[dict]:
    """All valid events of a log, in file order."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [ev for ev in map(decode, f) if ev is not None]


def describe(ev: dict) -> str | None:
    """A human line for the events a log pane or a headless console shows; None for the rest."""
    who = "" if ev["rank"] == PARENT else f"rank {ev['rank']}: "
    match ev:
        case {"kind": "message"}:
            level = ev.get("level", "info")
            return f"{who}{'' if level == 'info' else level + ': '}{ev.get('text', '')}"
        case {"kind": "epoch"}:
            return _epoch_line(ev)
        case {"kind": "settings"}:
            s = ev.get("settings") or {}
            body = ", ".join(f"{k} {onoff(v)}" for k, v in s.items())
            if ev.get("status") == "requested":
                return (f"settings requested: {body} (every rank applies them at the next "
                        "epoch; a: now)")
            step = f" step {ev['step']}" if ev.get("step") else ""
            return (f"settings {ev.get('status', 'applied')} from epoch {ev.get('epoch')}{step}: "
                    f"{body}")
        case {"kind": "checkpoint"}:
            return f"checkpoint written: {ev.get('path')}"
        case {"kind": "rank"}:
            reason = f" ({ev['reason']})" if ev.get("reason") else ""
            standby = f", standby {ev['standby']}" if isinstance(ev.get("standby"), str) else ""
            return f"rank {ev['rank']} {ev.get('state')}{reason}{standby}"
        case {"kind": "error"}:
            return (f"rank {ev['rank']} failed (exit code {ev.get('exit_code')}): "
                    f"{ev.get('text', '')}")
        case {"kind": "run", "status": "paused" | "resumed"}:
            return f"run {ev['status']} at step {ev.get('global_step')}"
    return None


def _epoch_line(ev: dict) -> str:
    s = ev.get("settings") or {}
    val = (f"  val_loss {ev['val_loss']:.4f}  val_acc {100 * ev['val_acc']:.1f}%"
           if ev.get("val_acc") is not None else "")
    # A rank's own event is per rank; the run state's merged row sums its `ranks`.
    n = ev.get("ranks")
    if ev.get("source") == "output":  # read from a script's output: no rates, no settings
        return f"{epoch_label(ev)}: loss {_num(ev.get('train_loss'))}{val}{figures(ev)}"
    rate = f"img/s ({count(n, 'rank')})" if n else "img/s/rank"
    samples, wait = ev.get("samples_per_s"), ev.get("data_wait")
    # Settings only where the rank has ours (a script without run.loader() has none).
    named = (f"  [prefetch {onoff(s.get('prefetch'))}, workers {onoff(s.get('workers'))}, "
             f"cudnn.benchmark {onoff(s.get('cudnn_benchmark'))}]" if s else "")
    return (f"{epoch_label(ev)}: loss {_num(ev.get('train_loss'))}{val}{figures(ev)}  "
            f"{'-' if samples is None else f'{samples:,.0f}'} {rate}  "
            f"data-wait {'-' if wait is None else f'{100 * wait:.0f}%'}{named}")


def count(n: int, noun: str) -> str:
    """'1 rank', '2 ranks': every message that counts something says it this way."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def epoch_label(ev: dict) -> str:
    """'epoch 3', 'epoch 3 steps 40-90' for the part of an epoch between two changes, or
    'step 250' for the evaluation of a script that names no epochs."""
    if ev.get("at_step") is not None:
        return f"step {ev['at_step']}"
    start, end = ev.get("start_step") or 0, ev.get("end_step")
    if start or ev.get("partial"):
        return f"epoch {ev['epoch']} steps {start}-{end}"
    return f"epoch {ev['epoch']}"


def figures(ev: dict) -> str:
    """A script's other figures of the epoch (--metric, run.log): '  acc 93.1  lr 0.01'."""
    return "".join(f"  {k} {v:.4g}" if isinstance(v, (int, float)) else f"  {k} {v}"
                   for k, v in (ev.get("metrics") or {}).items())


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def onoff(v) -> str:
    """A setting as the screens write it: on/off for a switch, '-' for none, else the value."""
    if v is None:
        return "-"
    return ("on" if v else "off") if isinstance(v, bool) else str(v)
