"""The run's charts, with axes: loss per rank and smoothed, img/s with input wait on a second
axis, over time since launch, with world and settings changes marked where they happened."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual_plotext import PlotextPlot

from ddptui.contract.state.timeline import bins, smooth
from ddptui.dashboard.view.widgets.bars import duration

RANK_COLORS = ("cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white")
MARK_COLOR = "gray"
BUILD_PAUSE = 3.0  # after a build, its duration times this before the next: charts <= 1/4 busy


class Chart(PlotextPlot):
    """A plot built on a thread: plotext takes 25-200 ms to build one (8 ranks over an hour), which
    on the UI thread would hold up the keys; the screen shows the last built plot until the next
    one is ready. One build at a time, of the newest data, and a pause after it: builds asked
    faster than they finish would take the interpreter from the keys."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._shown: tuple[Size, Text] | None = None
        self._draw: Callable[[object, int], None] | None = None
        self._lock = threading.Lock()  # guards _draw and _building across the threads
        self._building = False

    def redraw(self, draw: Callable[[object, int], None]) -> None:
        """`draw(plt, width)` fills the plot; it is built at the current size and shown."""
        with self._lock:
            self._draw = draw
            start = not self._building and bool(self.size.area)
            self._building = self._building or start
        if start:
            self.run_worker(self._build, thread=True, group=f"chart-{id(self)}",
                            exit_on_error=False)

    def _build(self) -> None:
        try:
            self._build_newest()
        except Exception:  # a plot that failed: the next redraw builds again
            with self._lock:
                self._building = False
            raise

    def _build_newest(self) -> None:
        while True:
            # The pause weighs the interpreter's time the build took (its thread's CPU), not the
            # wall time: on a loaded host, waiting for the GIL and the cores would swell it.
            draw, started = self._draw, time.thread_time()
            assert draw is not None
            size = self.size
            draw(self.plt, size.width)
            # PlotextPlot's own render sizes the figure, applies the app's theme and builds it.
            text = PlotextPlot.render(self)
            try:
                self.app.call_from_thread(self._show, size, text)
            except RuntimeError:  # the app closed meanwhile
                return
            time.sleep(BUILD_PAUSE * (time.thread_time() - started))
            with self._lock:  # with the flag: a redraw asked now starts a worker of its own
                if self._draw is draw and self.size == size:
                    self._building = False
                    return

    def _show(self, size: Size, text: Text) -> None:
        self._shown = (size, text)
        self.refresh()

    @property
    def drawn(self) -> bool:
        """A plot built for the size the chart has now is on screen (or nothing to draw)."""
        return self._draw is None or (self._shown is not None and self._shown[0] == self.size)

    def render(self) -> Text:
        shown_size, text = self._shown or (None, Text(""))
        if shown_size != self.size and self._draw is not None and self.size.area:
            self.call_later(self.redraw, self._draw)  # first shown, or resized: build for it
        return text


class RunCharts(Vertical):
    """Two plots; `show(charts)` redraws them from RunState.charts()."""

    def compose(self) -> ComposeResult:
        yield Chart(id="loss-chart")
        yield Chart(id="rate-chart")

    def show(self, charts: dict) -> None:
        span = max(1.0, charts["now"])
        self.query_one("#loss-chart", Chart).redraw(
            lambda plt, width: draw_loss(plt, charts, span, max(10, 2 * width)))
        rate = self.query_one("#rate-chart", Chart)
        # A script that reports no rates (its loss read from its output): the loss takes it all.
        rate.display = not charts.get("script") or bool(charts["rate"])
        title = "loss · img/s and input wait" if rate.display else "loss"
        if self.border_title != title:  # each set repaints it
            self.border_title = title
        if rate.display:
            rate.redraw(lambda plt, width: draw_rate(plt, charts, span, max(10, 2 * width)))


def draw_loss(plt, charts: dict, span: float, points: int) -> None:
    """Each rank's loss (thin), the lowest rank's smoothed (bold); past a few ranks their band
    (lowest, median, highest); y labelled, x in time."""
    _start(plt, span)
    lines, shown = charts["loss"], []
    for (name, band), color in zip(charts.get("band", {}).items(), ("cyan", "white", "magenta"),
                                   strict=False):
        xs, ys = _xy(bins(band, points))
        plt.plot(xs, ys, marker="braille", color=color, label=f"{name} of {charts['ranks']} ranks")
        shown += ys
    for i, (rank, line) in enumerate(lines.items()):
        xs, ys = _xy(bins(line, points))
        if xs:
            label = f"rank {rank}" if len(lines) <= 4 else ("ranks" if i == 0 else None)
            plt.plot(xs, ys, marker="braille", color=RANK_COLORS[i % len(RANK_COLORS)],
                     label=label)
            shown += ys
    if lines:
        xs, ys = _xy(smooth(bins(next(iter(lines.values())), points)))
        plt.plot(xs, ys, marker="hd", color="white", label="smoothed")
    _loss_axis(plt, [y for y in shown if math.isfinite(y)])
    plt.ylabel("loss")
    _marks(plt, charts["marks"])


def draw_rate(plt, charts: dict, span: float, points: int) -> None:
    """The members' img/s (left axis) and their input wait in % of a step (right axis)."""
    _start(plt, span)
    xs, ys = _xy(bins(charts["rate"], points))
    if xs:
        plt.plot(xs, ys, marker="braille", color="green", label="img/s")
        top = max(ys) * 1.1 or 1.0
        plt.ylim(0, top)
        ticks = [top * i / 4 for i in range(5)]
        plt.yticks(ticks, [_count(v) for v in ticks])
    xs, ys = _xy(bins(charts["wait"], points))
    if xs:
        plt.plot(xs, ys, marker="braille", color="orange", label="wait %", yside="right")
        plt.ylim(0, 100, yside="right")
    plt.ylabel("img/s")
    plt.xlabel("time since launch")
    _marks(plt, charts["marks"])


def _start(plt, span: float) -> None:
    plt.clear_figure()
    plt.xlim(0, span)
    ticks = [span * i / 4 for i in range(5)]
    plt.xticks(ticks, [duration(t) for t in ticks])


def _marks(plt, marks: list[tuple[float, str]]) -> None:
    for t, _label in marks:
        plt.vline(t, MARK_COLOR)


def _loss_axis(plt, ys: list[float]) -> None:
    """Five ticks over the losses shown, labelled to four figures: plotext's own ticks for one
    point (or a flat line) read 6.2650000000000006."""
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 0.5
    lo, hi = lo - pad, hi + pad
    plt.ylim(lo, hi)
    ticks = [lo + (hi - lo) * i / 4 for i in range(5)]
    plt.yticks(ticks, [f"{v:.4g}" for v in ticks])


def _count(v: float) -> str:
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:,.0f}"


def _xy(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    return [p[0] for p in points], [p[1] for p in points]
