"""The two tables: ranks (one row per rank, the selected one highlighted) and epochs (one row
per finished epoch, or part of one, with the settings and world in force, so a change's effect
is visible)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

STATE_STYLE = {"running": "green", "starting": "yellow", "restarting": "yellow", "standby": "blue",
               "stopped": "dim", "crashed": "bold red", "done": "cyan", "stalled": "bold red",
               "waiting": "yellow", "slow": "bold yellow"}
TIMED = ("stalled", "waiting", "slow")  # states that say how long they have lasted


def _fmt(value, spec: str, dash: str = "-") -> str:
    return dash if value is None else format(value, spec)


class RankTable(DataTable):
    """Rank, state, position, loss, speed, input wait, workers, pid, device (most telling
    first, so a narrow terminal cuts the least useful columns)."""

    COLUMNS = ("rank", "state", "epoch/step", "loss", "img/s", "step ms", "wait", "workers",
               "pid", "device")
    can_focus = False

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for name in self.COLUMNS:
            self.add_column(name, key=name)

    def show(self, view: dict, selected: int) -> None:
        workers = view["settings"].get("workers", "-")
        several_hosts = len({r.host for r in view["ranks"] if r.host}) > 1  # attach, multi-node
        for r in view["ranks"]:
            device = f"{r.host} {r.device}" if several_hosts else r.device
            current = r.state in ("running", "slow", "stalled", "waiting")
            age = view["now"] - r.last_step_t if r.last_step_t else 0.0
            # A figure whose steps stopped coming says how old it is, never passes as current.
            stale = current and age > max(2.0, 3 * r.step_ms / 1000)
            rate = _fmt(r.samples_per_s if current else None, ",.0f")
            cells = (
                str(r.rank), state_cell(r, view["now"]), f"{r.epoch}/{r.step}",
                _fmt(r.loss, ".4f"),
                Text(f"{rate} {age:.0f}s ago", style="dim") if stale else rate,
                _fmt(r.step_ms if current and not stale else None, ".1f"),
                f"{100 * r.data_wait:.0f}%", str(workers), str(r.pid or "-"), device or "-")
            key = str(r.rank)
            if key in self.rows:
                for column, value in zip(self.COLUMNS, cells, strict=True):
                    # Widen as values grow ("-" at the first row, "12,937" later).
                    self.update_cell(key, column, value, update_width=True)
            else:
                self.add_row(*cells, key=key)
        index = next((i for i, r in enumerate(view["ranks"]) if r.rank == selected), 0)
        if self.row_count and self.cursor_row != index:
            self.move_cursor(row=index)


def state_cell(r, now: float) -> Text:
    """'stalled 12s', 'stopped · standby warming 4s', 'crashed (killed by SIGKILL) · ...'."""
    text = r.state
    if r.state in TIMED and r.state_t:
        text += f" {now - r.state_t:.0f}s"
    if r.state == "crashed" and r.reason:
        why = "killed by ddptui" if r.reason.startswith("killed by ddptui") else \
            r.reason.removeprefix("killed by ")  # "SIGKILL", or the exception's line
        text += f" ({why})"
    if r.standby:
        text += f" · standby {r.standby}"
        if r.standby == "warming" and r.standby_t:
            text += f" {now - r.standby_t:.0f}s"
    return Text(text, style=STATE_STYLE.get(r.state, ""))


class EpochTable(DataTable):
    """Epoch, settings in force, throughput, input wait, losses, accuracy."""

    COLUMNS = ("epoch", "prefetch", "workers", "bench", "img/s", "wait", "loss", "val_loss",
               "val_acc", "bad", "ranks")
    can_focus = False

    def on_mount(self) -> None:
        self.zebra_stripes = True
        for name in self.COLUMNS:
            self.add_column(name, key=name)

    def show(self, view: dict) -> None:
        for e in view["epochs"]:
            key = f"{e['epoch']}:{e['start_step']}"
            if key in self.rows:
                continue
            s = e["settings"]
            label = str(e["epoch"])
            if e["start_step"] or e["partial"]:  # part of an epoch, cut by a change
                label += f" ·{e['start_step']}-{e['end_step']}"
            if e["at_quit"]:
                label += " quit"
            elif e["rolled_back"]:
                label += " rolled back"
            self.add_row(
                label, "on" if s.get("prefetch") else "off", str(s.get("workers", "-")),
                "on" if s.get("cudnn_benchmark") else "off", f"{e['samples_per_s']:,.0f}",
                f"{100 * e['data_wait']:.0f}%", _fmt(e["train_loss"], ".4f"),
                _fmt(e["val_loss"], ".4f"),
                "-" if e["val_acc"] is None else f"{100 * e['val_acc']:.1f}%",
                str(e["bad_samples"]), str(e["world_size"]), key=key)
            self.scroll_end(animate=False)
