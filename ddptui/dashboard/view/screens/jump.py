"""/ N Enter: the rank numbered N selected, wherever it is (a job of hundreds of ranks folds them
by node; reaching rank 300 with `down` was 300 presses)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class JumpToRank(ModalScreen[int | None]):
    """Answers the rank typed, or None (Escape, or not a rank of this run)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, ranks: list[int]):
        super().__init__()
        self.ranks = ranks

    def compose(self) -> ComposeResult:
        with Vertical(id="jump"):
            yield Label(f"Go to rank ({min(self.ranks)}-{max(self.ranks)}), Enter:")
            yield Input(type="integer", max_length=7, id="jump-rank")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if value.isdigit() and int(value) in self.ranks:
            self.dismiss(int(value))
        else:
            self.notify(f"no rank {value or '?'} in this run", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)
