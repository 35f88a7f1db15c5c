"""A rank's vitals file: the optimizer steps it took and the moves of its main thread, as the
rank writes it (ddptui/rank/telemetry/vitals.py) and its run or its sidecar reads it: a sign of
life for a rank that prints nothing.
"""

from __future__ import annotations

RECORD = 48  # bytes: "STEPS MOVES\n", padded, rewritten in place


def vitals_path(stacks_path: str) -> str:
    """A rank's vitals file, beside its stacks file (<stem>.rankN.stacks)."""
    return stacks_path.removesuffix(".stacks") + ".vitals"


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
