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
| s | stop the selected rank at the next agreed step; the others go on, re-sharded |
| r | restart it: a stopped or crashed rank joins again from its warm standby (queued while it warms) |
| k | kill it (a stalled rank above all): the others go on through crash recovery |
| t | its Python stacks, every thread (taken by the supervisor when a rank stalls) |
| g | the GPU screen: each GPU's load, memory and power over five minutes, clocks, traffic, other processes |
| space | pause / resume: every rank waits at the same step (GPUs go idle); PAUSING until it does |
| p | prefetcher on/off, from the next epoch on every rank |
| w / W | DataLoader workers -1 / +1, from the next epoch |
| b | cudnn.benchmark on/off, from the next epoch |
| a | apply pending settings now, at the next agreed step (no sample skipped or seen twice) |
| c | checkpoint now (needs --checkpoint-dir) |
| ? | this help |
| q, Ctrl-C | quit: ranks stop at an agreed step, checkpoint (if a directory is set), every process ends |

The charts show each rank's loss and a smoothed line, img/s and the input wait over time since
launch, with grey lines where the world or the settings changed. The ranks table's *step times*
are each rank's last steps on one scale (a slow rank stands taller); the epochs table's last
row is the epoch now running, filled in at its end.

Setting changes show as *pending* in the header of the epochs table until every rank applies
them; the epochs table then shows img/s and data-wait before and after (a change inside an epoch
splits its row). A rank that dies is dropped: the others roll back to their last common step and
go on (`--max-restarts K` brings crashed ranks back by itself). A rank that finishes no step
for `--stall-after` seconds shows *stalled*, the ranks blocked on it *waiting*; a rank 15%
slower than the others shows *slow* with the likely cause.

Your own script (`ddptui run train.py`): its ranks leave and come back together, so *s*, *r*
and *k* offer to restart every rank (*k* kills the selected one at once; *r* on a failed run
starts it again). *t*, *g* and *q* work with no code change; *space*, *c* and a clean *q*
(`run.should_stop`) need `ddptui.init()` and `run.step()` in its loop; *p*, *w*/*W*, *b* and
*a* need its DataLoader made by `run.loader()`.

Press **escape**, **?** or **q** to close.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Markdown(HELP)
