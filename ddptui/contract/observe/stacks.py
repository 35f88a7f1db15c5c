"""Python stacks of a rank, fetched from outside: SIGUSR1 makes the rank's faulthandler write
every thread's stack to its .stacks file (registered at start-up), read back here. The signal
goes only to a rank that has a handler for it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ddptui.contract.protocol.events import PARENT, Stacks

STACKS_WAIT_S = 2.0  # a process that cannot run its signal handler (SIGSTOP) answers later


@dataclass
class Awaited:
    """A file another process was asked to write: in once written and no longer growing, or
    given up on past its deadline."""

    path: str
    deadline: float
    size: int = -1

    def settled(self, now: float) -> int | None:
        """The file's size once it is in (0: none came by the deadline); None while waiting."""
        try:
            size = os.path.getsize(self.path)
        except OSError:
            size = 0
        finished = size > 0 and size == self.size
        self.size = size
        return size if finished or now > self.deadline else None


def settled_answers(pending: dict[int, Awaited], now: float,
                    read: Callable[[str], Any]) -> list[tuple[int, Any]]:
    """(slot, read(its file)) for the answers in since the last call, taken out of `pending`;
    None for a slot whose answer never came."""
    done = []
    for slot, awaited in list(pending.items()):
        size = awaited.settled(now)
        if size is not None:
            del pending[slot]
            done.append((slot, read(awaited.path) if size else None))
    return done


def catches(pid: int, sig: int) -> bool | None:
    """Whether process `pid` has a handler for `sig` now (Linux: /proc/PID/status's SigCgt);
    None where that cannot be told (another OS, the process gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


NO_HANDLER = "it has no stacks handler now (starting, or its interpreter ending)"


class StackRequests:
    """ask() signals a rank; collect() returns the answers that are complete (or timed out)."""

    def __init__(self):
        self.pending: dict[int, Awaited] = {}

    def ask(self, slot: int, pid: int, path: str, now: float,
            sig: int = signal.SIGUSR1) -> bool:
        """False when the rank was not asked: gone, or with no handler for `sig` (the signal's
        default would end it: a diagnostic never kills)."""
        if catches(pid, sig) is False:
            return False
        try:
            with open(path, "w"):  # empty it: the rank appends
                pass
            os.kill(pid, sig)
        except OSError:
            return False
        self.pending[slot] = Awaited(path, now + STACKS_WAIT_S)
        return True

    def collect(self, now: float) -> list[tuple[int, str | None]]:
        """(slot, stacks) for answers complete since the last call; None when none came."""
        return settled_answers(self.pending, now, _read)


def stacks_said(slot: int, text: str | None, stalled: bool) -> Stacks:
    """The event that carries a rank's stacks to the stacks screen (`stacks_of`), or says why
    none came; a warning for a stalled rank."""
    if text is None:
        why = "its process is stopped (SIGSTOP?)" if stalled else "no answer"
        return no_stacks(slot, why)
    where = innermost(text)
    return Stacks(rank=PARENT, level="warning" if stalled else "info",
                  text=f"rank {slot} is in {where}" if where else f"rank {slot}: stacks taken",
                  stacks_of=slot, stacks=text)


def no_stacks(slot: int, why: str) -> Stacks:
    return Stacks(rank=PARENT, level="warning", text=f"rank {slot}: no Python stacks: {why}",
                  stacks_of=slot, stacks="")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def innermost(stacks: str, frames: int = 3) -> str:
    """The main thread's innermost frames, one line: 'fn (file.py:12) < caller (...)'.
    faulthandler lists the newest thread first, so the main thread comes last."""
    blocks = [b for b in stacks.split("\n\n") if "most recent call first" in b]
    if not blocks:
        return ""
    lines = [ln.strip() for ln in blocks[-1].splitlines()[1:] if ln.strip().startswith("File")]
    out = []
    for line in lines[:frames]:
        # File "/path/to/mod.py", line 12 in fn
        path, _, rest = line.removeprefix('File "').partition('", line ')
        number, _, fn = rest.partition(" in ")
        out.append(f"{fn} ({os.path.basename(path)}:{number})")
    return " < ".join(out)
