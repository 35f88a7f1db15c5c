"""The help screen: every key of the dashboard and what it does."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# ddptui keys

| key | what it does |
|---|---|
| up / down | select a rank in the ranks table |
| space | pause / resume: every rank waits at the same step (GPUs go idle) |
| p | prefetcher on/off, from the next epoch on every rank |
| w / W | DataLoader workers -1 / +1, from the next epoch |
| b | cudnn.benchmark on/off, from the next epoch |
| c | checkpoint now (needs --checkpoint-dir) |
| ? | this help |
| q, Ctrl-C | quit: ranks stop at an agreed step, checkpoint (if a directory is set), every process ends |

Setting changes show as *pending* in the header of the epochs table until every rank applies
them at the epoch boundary; the epochs table then shows img/s and data-wait before and after.

Press **escape**, **?** or **q** to close.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Markdown(HELP)
