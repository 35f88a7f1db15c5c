"""The stacks screen: every thread's Python stack of one rank, as its faulthandler wrote them
(asked for with `t`, or taken by the supervisor when the rank stalled); scrollable."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import Label, Static


class StacksScreen(ModalScreen):
    """Shows RankView.stacks of `rank`; the app sets `stacks` as new ones arrive."""

    BINDINGS = [Binding("escape,t,q", "dismiss", "Close")]
    stacks: reactive[str | None] = reactive(None)

    def __init__(self, rank: int, asked: bool):
        super().__init__()
        self.rank, self.asked = rank, asked

    def compose(self) -> ComposeResult:
        with Vertical(id="stacks"):
            yield Label(f"[b]rank {self.rank}[/b]: Python stacks, newest thread first, the "
                        "main thread last    [b]escape[/b] close")
            with VerticalScroll():
                yield Static(id="stacks-text")

    def watch_stacks(self, stacks: str | None) -> None:
        if not self.is_mounted:
            return
        if stacks:
            text = Text(stacks)
        elif stacks == "":
            text = Text("no answer: the process cannot run its signal handler (stopped?)",
                        style="yellow")
        else:
            text = Text("asking the rank for its stacks…" if self.asked
                        else "no stacks were taken for this rank", style="dim")
        self.query_one("#stacks-text", Static).update(text)

    def on_mount(self) -> None:
        self.watch_stacks(self.stacks)
