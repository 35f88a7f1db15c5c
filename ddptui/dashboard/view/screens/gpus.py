"""The GPU screen (`g`), like nvitop's: for every GPU of the run its utilisation, memory and power
over the last minutes with axes, its clocks and why they are held down, PCIe and NVLink traffic,
temperature, and the processes on it that are not part of the run (pid, user, memory)."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label

from ddptui.contract.state.views import GPU_HISTORY_S, RunView
from ddptui.dashboard.view.widgets.bars import mib
from ddptui.dashboard.view.widgets.charts import Chart

REPLOT_S = 1.0  # eight plots at ~25 ms each: once a second is plenty for a five-minute window


class GpuScreen(Screen):
    """Cards of the devices in `view` (set by the app as it refreshes) and a process table."""

    BINDINGS = [Binding("escape,g", "dismiss", "Back")]
    view: reactive[RunView | None] = reactive(None, always_update=True)

    def __init__(self):
        super().__init__()
        self._cards: list[GpuCard] = []
        self._plotted = 0.0
        self._ready = False
        self.grid = Grid(id="gpu-cards")
        self.others = DataTable(id="gpu-others", zebra_stripes=True)
        self.others.can_focus = False
        self.others.border_title = "other processes on these GPUs"

    def compose(self) -> ComposeResult:
        yield Label("[b]GPUs of the run[/b]: the last five minutes    [b]escape[/b] back",
                    id="gpus-title")
        yield self.grid
        yield self.others
        yield Footer()

    def on_mount(self) -> None:
        self.others.add_columns("GPU", "pid", "user", "name", "memory")
        self._ready = True
        self.watch_view(self.view)

    def watch_view(self, view: RunView | None) -> None:
        if not self._ready or view is None:
            return
        devices = view.devices
        if [d.key for d in devices] != [c.key for c in self._cards]:
            self.grid.remove_children()
            self._cards = [GpuCard(d.key) for d in devices]
            self.grid.mount_all(self._cards)
            self.grid.styles.grid_size_columns = 1 if len(devices) == 1 else 2
            self._plotted = 0.0
        replot = time.monotonic() - self._plotted >= REPLOT_S
        if replot:
            self._plotted = time.monotonic()
        for card, d in zip(self._cards, devices, strict=True):
            card.show(d, view.now, replot)
        self._show_others(devices)

    def _show_others(self, devices: list) -> None:
        table = self.others
        rows = [(d.key.replace("gpu", "GPU "), *other) for d in devices for other in d.others]
        table.clear()
        for gpu, pid, mem, *owner in rows:
            user, name = (owner + ["?", "?"])[:2]
            table.add_row(gpu, str(pid), user, name, mib(mem))
        if not rows:
            table.add_row("-", "-", "-", "no other process on the run's GPUs", "-")


class GpuCard(Vertical):
    """One device: a line of current figures over a chart of its last minutes."""

    def __init__(self, key: str):
        self.figures, self.plot = Label(), Chart()
        super().__init__(self.figures, self.plot, classes="gpu-card")
        self.key = key

    def show(self, d, now: float, replot: bool) -> None:
        self.figures.update(figures(d))
        if replot:
            self.plot.redraw(lambda plt, _width: draw_history(plt, d, now))


def figures(d) -> Text:
    """'GPU 0  util 97%  mem 5.7G/140.4G  650 W  55 C  SM 1980 / mem 3201 MHz', then the bus
    traffic and what holds the clocks down."""
    name = d.key.replace("gpu", "GPU ") if d.util is not None else f"rank {d.rank} (CPU)"
    text = Text(name, style="bold")
    if d.util is None:
        text.append(f"  cpu {d.cpu_percent or 0:.0f}%  rss {mib(d.rss)}")
        return text
    text.append(f"  util {d.util:.0f}%  mem {mib(d.mem_used)}/{mib(d.mem_total)}  "
                f"{d.power_w or 0:.0f} W  {d.temp_c or 0:.0f} C")
    if d.sm_clock:
        text.append(f"  SM {d.sm_clock}" + (f" / mem {d.mem_clock}" if d.mem_clock else "") +
                    " MHz")
    text.append("\n")
    if d.held_down:  # first on its line: the reason a slow GPU is slow
        text.append("clocks held down: " + ", ".join(d.held_down) + "  ", style="bold red")
    for bus in ("pcie", "nvlink"):
        rx, tx = getattr(d, f"{bus}_rx"), getattr(d, f"{bus}_tx")
        if rx is not None or tx is not None:
            text.append(f"{'PCIe' if bus == 'pcie' else 'NVLink'} rx {rx or 0:,.0f} "
                        f"tx {tx or 0:,.0f} MB/s  ")
    if d.stale:
        text.append(f"last reading {d.age:.0f}s ago", style="dim")
    return text


def draw_history(plt, d, now: float) -> None:
    """Utilisation and memory in % (left axis), power in W (right), seconds before now."""
    plt.clear_figure()
    rows = [r for r in d.history if r[0] >= now - GPU_HISTORY_S]
    xs = [r[0] - now for r in rows]
    plt.xlim(-GPU_HISTORY_S, 0)
    ticks = [-GPU_HISTORY_S + i * 60 for i in range(int(GPU_HISTORY_S // 60) + 1)]
    plt.xticks(ticks, [f"{t / 60:.0f}m" if t else "now" for t in ticks])
    plt.ylim(0, 100)
    if xs:
        label = "util %" if d.util is not None else "cpu %"
        plt.plot(xs, [min(100, r[1] or 0) for r in rows], marker="braille", color="green",
                 label=label)
        if any(r[2] is not None for r in rows):
            plt.plot(xs, [r[2] or 0 for r in rows], marker="braille", color="magenta",
                     label="mem %")
        if any(r[3] for r in rows):
            plt.plot(xs, [r[3] or 0 for r in rows], marker="braille", color="orange",
                     label="power W", yside="right")
            plt.ylim(0, max(r[3] or 0 for r in rows) * 1.1, yside="right")
    plt.ylabel("%")
