"""The heat map's figures: each rank's step time, second by second, against that second's median
over every rank; a straggler is a stripe, a hang a dark column. Read under the state's lock.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddptui.contract.state.runstate import RunState


@dataclass(frozen=True)
class Heat:
    """cells[row][column]: a column's ranks' worst step time over the row's median (None: no
    step of them in that span); rows oldest first."""

    ranks: list[int]
    per_column: int  # ranks a column stands for (the slowest of them is shown)
    row_s: float  # seconds a row spans
    cells: list[list[float | None]]


def heat(state: RunState, columns: int, rows: int) -> Heat:
    """The last `rows` spans of every rank's steps, in at most `columns` columns; a span is a
    second, or two steps where a step takes longer (a slow step is no hang)."""
    with state.lock:
        now = state._now()
        ranks = sorted(state.ranks)
        lines = {r: list(state.ranks[r].step_line) for r in ranks}
        step_s = [state.ranks[r].step_ms / 1000 for r in ranks if state.ranks[r].step_ms]
    row_s = max(1.0, 2 * statistics.median(step_s)) if step_s else 1.0
    per = max(1, -(-len(ranks) // max(1, columns)))
    start = now - rows * row_s
    spans: list[dict[int, float]] = [{} for _ in range(rows)]  # rank -> its worst step there
    for rank, points in lines.items():
        for t, ms in points:
            row = int((t - start) // row_s)
            if 0 <= row < rows:
                spans[row][rank] = max(ms, spans[row].get(rank, 0.0))
    cells = []
    for span in spans:
        timed = [ms for ms in span.values() if ms]
        median = statistics.median(timed) if timed else None
        line: list[float | None] = []
        for c in range(0, len(ranks), per):
            known = [span[rank] for rank in ranks[c:c + per] if rank in span]
            # A step with no time known (read from a script's output) is a step: not dark.
            line.append(None if not known else max(known) / median if median and max(known)
                        else 1.0)
        cells.append(line)
    return Heat(ranks, per, row_s, cells)
