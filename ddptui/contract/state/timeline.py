"""Time series for the charts: a whole run in bounded memory (Timeline halves its resolution
when full), the ranks' loss band past a few ranks, and the last minutes at full resolution
(Recent)."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddptui.contract.state.runstate import RunState


class Timeline:
    """(t, value) points from the start of a run. Past `capacity` points, neighbours are merged
    pairwise and each later point stands for twice as many readings: an hour-long run and a
    minute-long one both fit, and memory stays flat."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity + capacity % 2
        self.points: list[tuple[float, float]] = []
        self.stride = 1  # readings per stored point
        self._sum_t = self._sum_v = 0.0
        self._n = 0

    def add(self, t: float, value: float) -> None:
        self._sum_t += t
        self._sum_v += value
        self._n += 1
        if self._n < self.stride:
            return
        self.points.append((self._sum_t / self._n, self._sum_v / self._n))
        self._sum_t = self._sum_v = 0.0
        self._n = 0
        if len(self.points) >= self.capacity:
            pts = self.points  # an even count: capacity is
            self.points = [((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
                           for a, b in zip(pts[::2], pts[1::2], strict=True)]
            self.stride *= 2

    def copy(self) -> list[tuple[float, float]]:
        return list(self.points)


MANY = 16  # ranks past which the chart draws the loss band, not a line a rank
BAND = ("min", "median", "max")


class LossBand:
    """The ranks' loss as three lines over the run: the lowest, the median and the highest of
    the stepping ranks' latest loss, taken at each point of the img/s line. Past MANY ranks the
    chart draws these, not a line a rank: hundreds of lines are one blot, and 512 lines of 256
    points, copied and binned each second, were the charts' whole cost and memory."""

    def __init__(self):
        self.lines = {name: Timeline() for name in BAND}

    def add(self, t: float, losses: list[float]) -> None:
        losses = sorted(x for x in losses if math.isfinite(x))  # a NaN has no place in order
        if losses:
            for name, value in zip(BAND, (losses[0], losses[len(losses) // 2], losses[-1]),
                                   strict=True):
                self.lines[name].add(t, value)


class Recent:
    """The last `seconds` of (t, *values) readings, every one of them."""

    def __init__(self, seconds: float = 300.0, limit: int = 2000):
        self.seconds = seconds
        self.rows: deque = deque(maxlen=limit)

    def add(self, t: float, *values) -> None:
        self.rows.append((t, *values))
        while self.rows and self.rows[0][0] < t - self.seconds:
            self.rows.popleft()

    def copy(self) -> list[tuple]:
        return list(self.rows)


def bins(points: list[tuple[float, float]], count: int) -> list[tuple[float, float]]:
    """At most `count` points: the mean of each run of neighbours (a chart's width of them)."""
    if len(points) <= count:
        return points
    size = len(points) / count
    out = []
    for i in range(count):
        chunk = points[int(i * size):int((i + 1) * size)] or points[int(i * size):][:1]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out


def smooth(points: list[tuple[float, float]], alpha: float = 0.1) -> list[tuple[float, float]]:
    """An exponential moving average, as TensorBoard's smoothing (bias-corrected at the start)."""
    out, avg, weight = [], 0.0, 0.0
    for t, v in points:
        avg = (1 - alpha) * avg + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append((t, avg / weight))
    return out


def chart_series(state: RunState, now: float) -> dict:
    """The run's series for the charts: loss per rank (past MANY ranks, their band), img/s,
    input wait, change marks, in seconds since launch (the caller holds the state's lock)."""
    t0 = state.started_t or state.first_step_t or 0.0

    def rel(points):
        # A point before the launch (a node's clock behind ours) would stretch a line far off
        # the chart, and plotext draws every cell of it.
        return [(t - t0, v) for t, v in points if t >= t0]

    many = len(state.ranks) > MANY
    return {"loss": {} if many else {rank: rel(line.copy()) for rank, line in
                                     sorted(state.loss_lines.items())},
            "band": {name: rel(line.copy()) for name, line in state.loss_band.lines.items()}
            if many else {},
            "ranks": len(state.ranks),
            "rate": rel(state.rate_line.copy()), "wait": rel(state.wait_line.copy()),
            "marks": [(t - t0, label) for t, label in state.marks],
            "script": bool(state.meta.get("script")),
            "now": now - t0 if t0 else 0.0}
