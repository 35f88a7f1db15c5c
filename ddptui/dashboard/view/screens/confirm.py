"""The questions the dashboard asks before it acts: end the run, end an attached job, restart
every rank of a script (whose ranks cannot leave one at a time)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label


class ConfirmQuit(ModalScreen[str]):
    """q in a dashboard that can leave the run going (then always asked: it may be one of several,
    and the run outlives it), or where the last checkpoint is stale. Answers "quit", "detach" or
    "" (stay)."""

    BINDINGS = [Binding("y", "answer('quit')", "End the run"),
                Binding("d", "answer('detach')", "Leave it going"),
                Binding("n,escape", "answer('')", "Stay")]

    def __init__(self, age: float | None, checkpoints: bool, can_detach: bool):
        super().__init__()
        self.age, self.checkpoints, self.can_detach = age, checkpoints, can_detach

    def compose(self) -> ComposeResult:
        last = ("no checkpoint yet" if self.age is None else
                f"last checkpoint {self.age:.0f} s ago")
        then = f" ({last}; a final checkpoint is written first)" if self.checkpoints else ""
        with Vertical(id="confirm"):
            yield Label(f"End the run?{then}")
            yield Label("[b]y[/b] end it    " + ("[b]d[/b] leave it going    "
                                                 if self.can_detach else "")
                        + "[b]n[/b] keep watching")

    def action_answer(self, answer: str) -> None:
        if answer != "detach" or self.can_detach:
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
