"""e: where each rank's step time goes: a stacked bar a rank over its last seconds (data-wait,
copy, forward, backward, all-reduce wait, optimizer, rest) with its memory, the world's shares
over the last minutes, and the verdicts (who is slow, in which phase, and why; who waits for
whom; memory that grows). Redrawn every second; once the run ended, its verdict."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ddptui.contract.protocol.steptime import PHASES
from ddptui.contract.state.report import run_report
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.steptime import RankTimes
from ddptui.contract.state.verdicts import LABELS, gpus_of, judge, own_ms, untold
from ddptui.dashboard.view.widgets.bars import spark

COLOURS = {"data": "red", "h2d": "magenta", "forward": "blue", "backward": "cyan",
           "comm": "yellow", "optimizer": "green", "rest": "grey50"}
ROWS = 64  # ranks drawn a bar each (the slowest first past that: a 512-rank job)
TIME_ROWS = 6  # the height of the world's shares over time
SPARK = 16  # windows of memory a rank's line shows


def bar(means: dict[str, float], width: int) -> Text:
    """The phases of a step as one bar `width` cells wide, in PHASES' order."""
    total = sum(means.values()) or 1.0
    out, used = Text(), 0
    for phase in (p for p in PHASES if means.get(p)):
        cells = round(width * sum(means.get(q, 0.0) for q in PHASES[:PHASES.index(phase) + 1])
                      / total) - used
        out.append(" " * max(0, cells), style=f"on {COLOURS[phase]}")
        used += max(0, cells)
    return out


def over_time(seconds: list[dict[str, float]], width: int) -> Text:
    """The world's mean share of each phase, a column a second (oldest at the left), each
    column TIME_ROWS cells high and filled from the bottom in PHASES' order."""
    out = Text()
    for row in range(TIME_ROWS, 0, -1):  # top row first
        for col in seconds[-width:]:
            edge, colour = 0.0, "grey11"
            for phase in PHASES:
                edge += col.get(phase, 0.0)
                if edge * TIME_ROWS >= row - 0.5:
                    colour = COLOURS[phase]
                    break
            out.append(" ", style=f"on {colour}")
        out.append("\n")
    return out


def legend() -> Text:
    return Text.assemble(*((f" {LABELS[p]} ", f"black on {COLOURS[p]}") for p in PHASES),
                         "    escape close")


class StepTimeScreen(ModalScreen):
    """Each rank's phases and memory, and the verdicts, from `state`, redrawn every second."""

    BINDINGS = [Binding("escape,e,q", "dismiss", "Close")]

    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def compose(self) -> ComposeResult:
        with Vertical(id="steptime"):
            yield Label(id="steptime-title")
            yield Label(legend())
            with VerticalScroll():
                yield Static(id="steptime-ranks")
            yield Static(id="steptime-time")
            yield Static(id="steptime-verdict")

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0, self.redraw)

    def redraw(self) -> None:
        view = self.state.view()
        with self.state.lock:
            ranks = self.state.steptimes.copy()
            seconds = self.state.steptimes.shares_by_second()
        rows = self.query_one("#steptime-ranks", Static)
        if not ranks:
            rows.update(Text("no step of a DDP model seen yet: phases come a second after the "
                             "first steps", style="dim"))
            return
        width = max(10, (rows.size.width or 100) - 96)  # the rank, its memory and their line
        nvml = {r.rank: r.gpu_mem for r in view.ranks if r.gpu_mem}  # a script rank's, per process
        clock = {r.clock for r in ranks.values()}
        self.query_one("#steptime-title", Label).update(Text.from_markup(
            f"[b]where each rank's step time goes[/b]: its last seconds, "
            f"{'CUDA events' if clock == {'cuda'} else 'host clocks'}" + _unmeasured(ranks)))
        findings = judge(ranks, gpus_of(view), view.settings)
        slow = {f.rank for f in findings if f.kind == "slow"}
        text = Text()
        for slot in _shown(ranks):
            now = ranks[slot].now()
            if now is None:
                continue
            text.append(f"{'>' if slot in slow else ' '} rank {slot:<4} {now[0]:>9,.1f} ms ",
                        style="bold red" if slot in slow else "")
            text.append_text(bar(now[1], width))
            text.append(f"  {_memory(ranks[slot].memory, nvml.get(slot))} ")
            text.append_text(_memory_line(ranks[slot]))
            text.append("\n")
        rows.update(text)
        self.query_one("#steptime-time", Static).update(
            Text("the world's shares, a column a second:\n").append_text(
                over_time(seconds, max(10, (rows.size.width or 100) - 2))))
        lines = run_report(self.state)[1] if view.status in ("done", "failed", "interrupted") \
            else [f.text for f in findings] or ["no rank stands out"]
        self.query_one("#steptime-verdict", Static).update(Text("\n".join(lines)))


def _shown(ranks: dict[int, RankTimes]) -> list[int]:
    """Every rank in order; past ROWS, the slowest own times first."""
    if len(ranks) <= ROWS:
        return sorted(ranks)
    own = {s: own_ms(fig) for s, r in ranks.items() if (fig := r.now())}
    return sorted(own, key=lambda s: -own[s])[:ROWS]


def _unmeasured(ranks: dict[int, RankTimes]) -> str:
    left = untold(sorted({p for r in ranks.values() for p in r.measured}))
    return f"; not told apart here (in rest): {', '.join(left)}" if left else ""


def _memory(memory: dict, nvml: int | None) -> str:
    if not memory.get("peak"):
        return ""
    limit = f" of {memory['limit']:,.0f}" if memory.get("limit") else ""
    kind = "GPU" if memory.get("kind") == "cuda" else "RSS"
    process = f" (NVML {nvml:,})" if nvml else ""
    return f"{kind} {memory['allocated']:,.0f}{limit} MiB{process}, peak {memory['peak']:,.0f}"


def _memory_line(r: RankTimes) -> Text:
    """Its memory in use over its last windows, on a scale of their own (a creep shows)."""
    used = list(r.memory_line)[-SPARK:]
    if not used:
        return Text()
    lo, hi = min(used), max(used)
    return spark(used, SPARK, lo, max(hi, lo + 0.01 * (r.memory.get("limit") or 100.0)))
