"""The per-GPU panel: utilisation and memory bars, the last minutes of utilisation, power,
temperature and clocks (red when NVML says they are held down); with CPU ranks, each rank's CPU%
and RSS plus the host's CPU and memory. One line per device when there are many."""

from __future__ import annotations

import time

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ddptui.contract.state.views import RunView
from ddptui.dashboard.view.widgets.bars import bar, mib, spark
from ddptui.dashboard.view.widgets.rank_groups import GROUP_FROM

HISTORY_MIN = 8  # below this many cells the history column is left out
LEVELS = " ▁▂▃▄▅▆▇█"
NODES_S = 1.0  # the line a node's shortest redraw period


class DevicePanel(Static):
    """One or two rows per device, with bars sized to the panel's width."""

    # Repainted by watch_view, when what it draws changed.
    view: reactive[RunView | None] = reactive(None, layout=False, repaint=False)
    compact: reactive[bool] = reactive(False, layout=True)
    _node_lines: Text | None = None  # a line a node, as last drawn
    _drawn_t = 0.0  # when (monotonic)
    over = False  # no more events can come: every view is drawn

    def watch_view(self, old: RunView | None, new: RunView | None) -> None:
        # Only a change in the number of devices (or of the host lines) changes the height.
        if _lines(old) != _lines(new):
            self.refresh(layout=True)
        devices = new.devices if new else []
        if not (len(devices) >= GROUP_FROM and " " in devices[0].key):
            self._node_lines = None
            self.refresh()
            return
        # A line a node, drawn anew at most once a second while the run goes on (nvitop's
        # default is 2 s), and only when it changed: at 64 nodes a draw took 10-13 ms, and
        # views come five times a second.
        now = time.monotonic()
        if not self.over and now - self._drawn_t < NODES_S and _lines(old) == _lines(new):
            return
        nodes = _by_node(devices, max(3, self.app.size.height // 2 - 3))  # #top's room
        if nodes != self._node_lines:
            self._node_lines, self._drawn_t = nodes, now
            self.refresh()

    def render(self) -> Table | Text:
        v = self.view
        if not v or not v.devices:
            return Text("waiting for the first device reading…", style="dim")
        if self._node_lines is not None:
            return self._node_lines
        devices = v.devices
        # As wide as the longest label: "650W 55C" under a GPU, "node/0 GPU 1" under attach.
        label_width = max([7] + [len(_label(d)) for d in devices] +
                          ([] if self.compact else [len(_power(d)) for d in devices
                                                    if d.util is not None]))
        kind_width = 0 if self.compact else 4  # "util"/"mem": one line per device needs none
        room = max(5, self.size.width - label_width - kind_width - 17)
        history = room // 2 if room // 2 >= HISTORY_MIN else 0
        width = room - history - (1 if history else 0)
        table = Table.grid(padding=(0, 1))
        table.add_column(width=label_width, no_wrap=True)
        if kind_width:
            table.add_column(width=kind_width, no_wrap=True)
        table.add_column(width=width, no_wrap=True)
        table.add_column(width=12, no_wrap=True)
        if history:
            table.add_column(width=history, no_wrap=True)
        columns = (4 if kind_width else 3) + (1 if history else 0)
        for d in devices:
            for row in (_compact_rows if self.compact else _rows)(d, width, history):
                table.add_row(*row[:columns])
        host = v.host
        if host and not self.compact:
            table.add_row(Text("host", style="bold"), "cpu", bar(host.get("cpu_percent"), width),
                          f"{host.get('cpu_percent', 0):3.0f}%")
            table.add_row(Text(f"{host.get('cpus', '?')} cpus", style="dim"), "mem",
                          bar(host.get("mem_percent"), width, "magenta"),
                          f"{mib(host.get('mem_used'))}/{mib(host.get('mem_total'))}")
        return table


def _by_node(devices: list, room: int) -> Text:
    """A job of many GPUs on several nodes: a line a node, each GPU one cell of a bar chart
    (its utilisation's height; red: clocks held down; grey: no reading for a while), then the
    node's median utilisation and memory; nodes with such a GPU first, and past `room` lines,
    how many more. One Text, not a table: it is drawn at every refresh, and a table of 64
    rows cost a key press tens of milliseconds."""
    nodes: dict[str, list] = {}
    for d in devices:
        nodes.setdefault(d.key.rsplit(" ", 1)[0], []).append(d)
    order = sorted(nodes, key=lambda n: not any(d.stale or d.held_down for d in nodes[n]))
    shown = order if len(order) <= room else order[:room - 1]
    name_width = max(len(node) for node in shown)
    cells_width = max(len(nodes[node]) for node in shown)
    out = Text(no_wrap=True, overflow="crop")
    for i, node in enumerate(shown):
        gpus = nodes[node]
        out.append(("\n" if i else "") + node.ljust(name_width) + " ", "bold")
        for d in gpus:
            load = d.util if d.util is not None else min(d.cpu_percent or 0.0, 100)
            style = "dim" if d.stale else "bold red" if d.held_down else "cyan"
            out.append(LEVELS[min(len(LEVELS) - 1, int(load / 100 * len(LEVELS)))], style)
        loads = sorted(d.util if d.util is not None else d.cpu_percent or 0.0 for d in gpus)
        used = sum(d.mem_used or 0 for d in gpus)
        out.append(" " * (cells_width - len(gpus) + 1))
        out.append(f"{loads[len(loads) // 2]:3.0f}% {mib(used)}", "dim")
    if len(shown) < len(order):
        out.append(f"\n+{len(order) - len(shown)} more nodes, none with a GPU held down or "
                   "silent" if not any(d.stale or d.held_down for n in order[len(shown):]
                                        for d in nodes[n]) else
                   f"\n+{len(order) - len(shown)} more nodes", "dim")
    return out


def _lines(v: RunView | None) -> tuple[int, bool]:
    return (len(v.devices), bool(v.host)) if v else (0, False)


def _rows(d, width: int, history: int) -> list[tuple]:
    # A last reading (the rank is gone or the run is over) is drawn grey and says so.
    fade, last = ("dim", f" last {d.age:.0f}s") if d.stale else (None, "")
    load = d.util if d.util is not None else min(d.cpu_percent or 0.0, 100)
    trail = spark([h[1] for h in d.history], history, style=fade or "cyan")
    if d.util is None:  # a CPU rank: its process tree's CPU and memory
        return [(Text(_label(d), style=fade or "bold"), "cpu", bar(load, width, fade),
                 Text(f"{d.cpu_percent or 0:3.0f}%{last}", fade or ""), trail),
                ("", "rss", Text(""), mib(d.rss), "")]
    mem = 100 * d.mem_used / d.mem_total if d.mem_total else None
    return [(Text(_label(d), style=fade or "bold"), "util", bar(d.util, width, fade),
             Text(f"{d.util:3.0f}%{last}", fade or ""), trail),
            (Text(_power(d), style="dim"), "mem", bar(mem, width, fade or "magenta"),
             f"{mib(d.mem_used)}/{mib(d.mem_total)}", _clocks(d))]


def _compact_rows(d, width: int, history: int) -> list[tuple]:
    fade = "dim" if d.stale else None
    if d.util is None:
        return [(Text(_label(d), style=fade or "bold"),
                 bar(min(d.cpu_percent or 0.0, 100), width, fade),
                 Text(f"{d.cpu_percent or 0:3.0f}% {mib(d.rss)}", fade or ""),
                 spark([h[1] for h in d.history], history, style=fade or "cyan"))]
    return [(Text(_label(d), style=fade or "bold"), bar(d.util, width, fade),
             Text(f"{d.util:3.0f}% {mib(d.mem_used)}", fade or ""),
             _clocks(d) if d.held_down else spark([h[1] for h in d.history], history,
                                                  style=fade or "cyan"))]


def _clocks(d) -> Text:
    if d.held_down:
        return Text("held: " + ", ".join(d.held_down), style="bold red")
    return Text(f"SM {d.sm_clock} MHz" if d.sm_clock else "", style="dim")


def _label(d) -> str:
    return d.key.replace("gpu", "GPU ") if d.util is not None else f"rank {d.rank}"


def _power(d) -> str:
    return f"{d.power_w or 0:.0f}W {d.temp_c or 0:.0f}C"
