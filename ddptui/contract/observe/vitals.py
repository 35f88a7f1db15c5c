"""A rank's vitals file: the optimizer steps it took and the moves of its main thread, as the
rank writes it (ddptui/rank/telemetry/vitals.py) and its run or its sidecar reads it: a sign of
life for a rank that prints nothing.
"""

from __future__ import annotations

from ddptui.contract.protocol.codec import decode
from ddptui.contract.protocol.steptime import Phases

RECORD = 48  # bytes: "STEPS MOVES\n", padded, rewritten in place
PHASES_RECORD = 8192  # bytes: the step clock's newest windows, `phases` events, padded
PHASES_KEPT = 8  # windows (about a second each) in it: a run that reads it late misses none


def vitals_path(stacks_path: str) -> str:
    """A rank's vitals file, beside its stacks file (<stem>.rankN.stacks)."""
    return stacks_path.removesuffix(".stacks") + ".vitals"


def phases_path(stacks_path: str) -> str:
    """A rank's step clock's record, beside its stacks file."""
    return stacks_path.removesuffix(".stacks") + ".phases"


def read_phases(path: str) -> list[Phases]:
    """The rank's newest windows of phases, oldest first; none before it wrote any. A line torn
    by a write under way is left out (the next read has it)."""
    try:
        with open(path, "rb") as f:
            lines = f.read(PHASES_RECORD).split(b"\n")
    except OSError:
        return []
    return [ev for line in lines if isinstance(ev := decode(line), Phases)]


def vitals_record(steps: int, moves: int) -> bytes:
    return f"{steps} {moves}\n".ljust(RECORD).encode()


def read_vitals(path: str) -> tuple[int, int] | None:
    """(optimizer steps, moves of the main thread) as a rank last wrote them; None before it
    wrote any, or for a rank that keeps none."""
    try:
        with open(path, "rb") as f:
            steps, moves = f.read(RECORD).split()[:2]
        return int(steps), int(moves)
    except (OSError, ValueError):
        return None
