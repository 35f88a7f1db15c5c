"""h: every rank's step time over the last minute or two at a glance, as one picture: a column
a rank (or a few), a row a second, coloured against that second's median over every rank; a
straggler is a stripe, a hang a dark column from where it stopped. Redrawn every second."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ddptui.contract.state.heat import Heat, heat
from ddptui.contract.state.runstate import RunState

# (step time over the median up to, colour, what it is called in the key)
SHADES = ((1.05, "green4", "within 5%"), (1.15, "yellow3", "5-15%"), (1.3, "dark_orange", "15-30%"),
          (float("inf"), "red", "slower"))
NONE = "grey11"  # no step in that span


def picture(h: Heat, width: int = 1) -> Text:
    """The cells as coloured blocks `width` cells wide, rows oldest first."""
    out = Text()
    for i, row in enumerate(h.cells):
        for value in row:
            colour = NONE if value is None else next(c for bound, c, _ in SHADES if value <= bound)
            out.append(" " * width, style=f"on {colour}")
        if i < len(h.cells) - 1:
            out.append("\n")
    return out


class HeatScreen(ModalScreen):
    """The heat map of `state`, redrawn each second while it is open."""

    BINDINGS = [Binding("escape,h,q", "dismiss", "Close")]

    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def compose(self) -> ComposeResult:
        with Vertical(id="heat"):
            yield Label(id="heat-title")
            yield Static(id="heat-cells")
            yield Label(Text.assemble("step time against each span's median: ", *(
                (f" {name} ", f"on {colour}") for _, colour, name in SHADES),
                " ", (" no step ", f"on {NONE}"), "    escape close"))

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0, self.redraw)

    def redraw(self) -> None:
        cells = self.query_one("#heat-cells", Static)
        width, height = max(10, cells.size.width or 80), max(5, self.size.height - 6)
        h = heat(self.state, width, height)
        if not h.ranks:
            cells.update(Text("no rank has stepped yet", style="dim"))
            return
        self.query_one("#heat-title", Label).update(Text.from_markup(
            f"[b]ranks {h.ranks[0]}-{h.ranks[-1]}[/b] across ({h.per_column} a column: the "
            f"slowest of them), the last {len(h.cells) * h.row_s:.0f} s down ({h.row_s:.0f} s "
            "a row, the newest at the bottom)"))
        cells.update(picture(h, max(1, width // max(1, len(h.cells[0])))))
