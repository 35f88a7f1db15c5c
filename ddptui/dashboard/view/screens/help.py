"""The help screen: every key of the dashboard and what it does in the run on screen, or why it
cannot act there."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Markdown

from ddptui.contract.keys import keys_table

ABOUT = """\
The charts show each rank's loss and a smoothed line, img/s and the input wait over time since
launch, with grey lines where the world or the settings changed. The ranks table's *step times*
are each rank's last steps on one scale (a slow rank stands taller); the epochs table's last
row is the epoch now running, filled in at its end.

Setting changes show as *pending* in the header of the epochs table until every rank applies
them; the epochs table then shows img/s and data-wait before and after (a change inside an epoch
splits its row). A rank that dies is dropped: the others roll back to their last common step and
go on (`--max-restarts K` brings crashed ranks back by itself); a script without
`run.elastic()` ends every rank instead, as torchrun does (`--max-restarts K` starts them all
again). A rank that finishes no step
for `--stall-after` seconds shows *stalled*, the ranks blocked on it *waiting*; a rank 15%
slower than the others shows *slow* with the likely cause.

Press **escape**, **?** or **q** to close.
"""


def help_text(rows: list[tuple[str, str]]) -> str:
    """The keys as they act in the run on screen (`rows`: keys.key_rows), then how to read it."""
    return f"# ddptui keys\n\n{keys_table(rows)}\n\n{ABOUT}"


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def __init__(self, rows: list[tuple[str, str]]):
        super().__init__()
        self.text = help_text(rows)

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Markdown(self.text)
