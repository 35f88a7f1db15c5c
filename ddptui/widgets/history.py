"""Loss and throughput over time, as labelled sparklines (rank 0's loss, the total img/s)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label, Sparkline


class History(Vertical):
    """Two series; each label carries the latest value and the extreme that matters."""

    def compose(self) -> ComposeResult:
        yield Label("loss", id="loss-label")
        yield Sparkline([], summary_function=max, id="loss-spark")
        yield Label("img/s", id="rate-label")
        yield Sparkline([], summary_function=max, id="rate-spark")

    def show(self, view: dict) -> None:
        loss, rate = view["loss_history"], view["throughput_history"]
        width = max(1, self.size.width)
        self.query_one("#loss-spark", Sparkline).data = loss[-width * 2:]
        self.query_one("#rate-spark", Sparkline).data = rate[-width * 2:]
        if loss:
            self.query_one("#loss-label", Label).update(
                f"loss {loss[-1]:.4f}  (min {min(loss):.4f}, {len(loss)} points)")
        if rate:
            self.query_one("#rate-label", Label).update(
                f"img/s {rate[-1]:,.0f}  (max {max(rate):,.0f})")
