"""The run's charts, with axes: loss per rank and smoothed, img/s with input wait on a second
axis, over time since launch, with world and settings changes marked where they happened."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual_plotext import PlotextPlot

from ddptui.timeline import bins, smooth
from ddptui.widgets.bars import duration

RANK_COLORS = ("cyan", "orange", "green", "magenta", "blue", "red", "yellow", "white")
MARK_COLOR = "gray"


class RunCharts(Vertical):
    """Two plots; `show(charts)` redraws them from RunState.charts()."""

    def compose(self) -> ComposeResult:
        yield PlotextPlot(id="loss-chart")
        yield PlotextPlot(id="rate-chart")

    def show(self, charts: dict) -> None:
        loss, rate = self.query_one("#loss-chart", PlotextPlot), self.query_one("#rate-chart",
                                                                                 PlotextPlot)
        span = max(1.0, charts["now"])
        draw_loss(loss.plt, charts, span, max(10, 2 * loss.size.width))
        draw_rate(rate.plt, charts, span, max(10, 2 * rate.size.width))
        loss.refresh()
        rate.refresh()


def draw_loss(plt, charts: dict, span: float, points: int) -> None:
    """Each rank's loss (thin), the lowest rank's smoothed (bold), y labelled, x in time."""
    _start(plt, span)
    lines = charts["loss"]
    for i, (rank, line) in enumerate(lines.items()):
        xs, ys = _xy(bins(line, points))
        if xs:
            label = f"rank {rank}" if len(lines) <= 4 else ("ranks" if i == 0 else None)
            plt.plot(xs, ys, marker="braille", color=RANK_COLORS[i % len(RANK_COLORS)],
                     label=label)
    if lines:
        xs, ys = _xy(smooth(bins(next(iter(lines.values())), points)))
        plt.plot(xs, ys, marker="hd", color="white", label="smoothed")
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


def _count(v: float) -> str:
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:,.0f}"


def _xy(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    return [p[0] for p in points], [p[1] for p in points]
