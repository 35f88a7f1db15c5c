"""The events pane: the run's messages, newest last, long lines wrapped; it stays at its newest
line when the epochs table above it grows and takes its height."""

from __future__ import annotations

from textual import events
from textual.widgets import RichLog


class EventLog(RichLog):
    def __init__(self) -> None:
        super().__init__(id="events", max_lines=500, wrap=True, min_width=20)
        self.can_focus = False  # up/down belong to rank selection; the wheel still scrolls

    def on_resize(self, event: events.Resize) -> None:
        self.scroll_end(animate=False)
