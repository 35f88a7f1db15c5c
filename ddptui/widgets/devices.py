"""The per-GPU panel: utilisation and memory bars, power and temperature; with CPU ranks, each
rank's CPU% and RSS plus the host's CPU and memory."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ddptui.widgets.bars import bar, mib


class DevicePanel(Static):
    """One row per device, with bars sized to the panel's width."""

    view: reactive[dict | None] = reactive(None, layout=False)

    def render(self) -> Table | Text:
        v = self.view
        if not v or not v["devices"]:
            return Text("waiting for the first device reading…", style="dim")
        # As wide as the longest label: "650W 55C" under a GPU, "node/0 GPU 1" under attach.
        label_width = max([7] + [len(_label(d)) for d in v["devices"]] +
                          [len(_power(d)) for d in v["devices"] if d.util is not None])
        width = max(5, self.size.width - label_width - 19)
        table = Table.grid(padding=(0, 1))
        table.add_column(width=label_width, no_wrap=True)
        table.add_column(width=4, no_wrap=True)
        table.add_column(width=width, no_wrap=True)
        table.add_column(no_wrap=True)
        for d in v["devices"]:
            # A last reading (the rank is gone or the run is over) is drawn grey and says so.
            fade, last = ("dim", f" last {d.age:.0f}s") if d.stale else (None, "")
            if d.util is not None:
                mem = 100 * d.mem_used / d.mem_total if d.mem_total else None
                table.add_row(Text(_label(d), style=fade or "bold"), "util",
                              bar(d.util, width, fade), Text(f"{d.util:3.0f}%{last}", fade or ""))
                table.add_row(Text(_power(d), style="dim"),
                              "mem", bar(mem, width, fade or "magenta"),
                              f"{mib(d.mem_used)}/{mib(d.mem_total)}")
            else:
                cpu = d.cpu_percent or 0.0
                table.add_row(Text(_label(d), style=fade or "bold"), "cpu",
                              bar(min(cpu, 100), width, fade), Text(f"{cpu:3.0f}%{last}",
                                                                    fade or ""))
                table.add_row("", "rss", Text(""), mib(d.rss))
        host = v.get("host") or {}
        if host:
            table.add_row(Text("host", style="bold"), "cpu", bar(host.get("cpu_percent"), width),
                          f"{host.get('cpu_percent', 0):3.0f}%")
            table.add_row(Text(f"{host.get('cpus', '?')} cpus", style="dim"), "mem",
                          bar(host.get("mem_percent"), width, "magenta"),
                          f"{mib(host.get('mem_used'))}/{mib(host.get('mem_total'))}")
        return table


def _label(d) -> str:
    return d.key.replace("gpu", "GPU ") if d.util is not None else f"rank {d.rank}"


def _power(d) -> str:
    return f"{d.power_w or 0:.0f}W {d.temp_c or 0:.0f}C"
