"""The questions the dashboard asks before it acts: quit with a stale checkpoint, and restart
every rank of a script (whose ranks cannot leave one at a time)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label


class ConfirmQuit(ModalScreen[bool]):
    """Asked only when a checkpoint directory is set and the last checkpoint is stale."""

    BINDINGS = [Binding("y", "answer(True)", "Quit"), Binding("n,escape", "answer(False)", "Stay")]

    def __init__(self, age: float | None):
        super().__init__()
        self.age = age

    def compose(self) -> ComposeResult:
        age = "no checkpoint yet" if self.age is None else f"last checkpoint {self.age:.0f} s ago"
        with Vertical(id="confirm"):
            yield Label(f"Quit the run? ({age}; a final checkpoint is written first)")
            yield Label("[b]y[/b] quit    [b]n[/b] keep training")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class ConfirmEndJob(ModalScreen[bool]):
    """K in attach: the whole job ends, every rank of every node."""

    BINDINGS = [Binding("y", "answer(True)", "End the job"),
                Binding("n,escape", "answer(False)", "Stay")]

    def __init__(self, grace: float):
        super().__init__()
        self.grace = grace

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label("End the whole job? Every rank gets SIGTERM through its wrapper, and "
                        f"SIGKILL {self.grace:g} s later if it is still there; its launcher then "
                        "ends.")
            yield Label("[b]y[/b] end the job    [b]n[/b] keep it running")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class ConfirmRestart(ModalScreen[bool]):
    """A script's ranks leave and come back together: s, r and k offer to restart them all."""

    BINDINGS = [Binding("y", "answer(True)", "Restart every rank"),
                Binding("n,escape", "answer(False)", "Stay")]

    def __init__(self, rank: int, key: str):
        super().__init__()
        self.rank, self.key = rank, key

    def compose(self) -> ComposeResult:
        what = {"s": "leave", "r": "restart", "k": "be killed"}[self.key]
        with Vertical(id="confirm"):
            yield Label(f"Rank {self.rank} of a script cannot {what} on its own: the others "
                        "would be stuck in their next collective.")
            yield Label("Restart every rank? (SIGTERM, then a fresh start with "
                        "TORCHELASTIC_RESTART_COUNT + 1; the script's own checkpoint resumes it"
                        + ("; this rank is killed at once" if self.key == "k" else "") + ")")
            yield Label("[b]y[/b] restart every rank    [b]n[/b] keep running")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
