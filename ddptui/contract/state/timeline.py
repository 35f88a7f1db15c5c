"""Time series for the charts: a whole run in bounded memory (Timeline halves its resolution
when full), and the last minutes at full resolution (Recent)."""

from __future__ import annotations

from collections import deque

MANY, FEW = 16, 256  # ranks past which each rank's loss line holds FEW points


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

    def fit(self, capacity: int) -> None:
        """Hold at most `capacity` points from now on, halving the resolution until they fit."""
        self.capacity = capacity + capacity % 2
        while len(self.points) >= self.capacity:
            even, pts = len(self.points) & ~1, self.points  # an odd last point stays as it is
            self.points = [((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
                           for a, b in zip(pts[:even:2], pts[1:even:2], strict=True)] + pts[even:]
            self.stride *= 2


def loss_line(lines: dict[int, Timeline], rank: int, ranks: int) -> Timeline:
    """`rank`'s loss over the run. In a job of more than MANY ranks each holds FEW points: the
    chart draws their envelope, a chart's width of points (1,024 a rank would be some 60 MB at
    512 ranks, and the most of what attach keeps beside its log)."""
    line = lines.get(rank)
    if line is None:
        line = lines[rank] = Timeline()
    if ranks > MANY and line.capacity > FEW:
        line.fit(FEW)
    return line


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
