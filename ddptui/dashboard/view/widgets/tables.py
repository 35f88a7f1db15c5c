"""The two tables: ranks (one row per rank, the selected one highlighted, its recent step times
as a sparkline) and epochs (one row per finished epoch, or part of one, with the settings and
world in force, so a change's effect is visible, and a live row for the epoch now running)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey

from ddptui.contract.state.views import RunView
from ddptui.contract.wording import figures, onoff
from ddptui.dashboard.view.widgets import rank_groups
from ddptui.dashboard.view.widgets.bars import duration, spark
from ddptui.dashboard.view.widgets.cell_cache import CellCache, shown_as

STATE_STYLE = {"running": "green", "starting": "yellow", "restarting": "yellow", "standby": "blue",
               "stopped": "dim", "crashed": "bold red", "done": "cyan", "stalled": "bold red",
               "waiting": "yellow", "slow": "bold yellow", "unreachable": "bold magenta"}


def update_row(table: DataTable, key: str, cells: dict, widen: bool = False) -> None:
    """Update the cells whose value changed, and nothing else: each update makes the table
    render every visible row anew (measured: tables were 40% of the dashboard's CPU). `widen`:
    a column grows for a longer value (never measured again for a shorter one)."""
    for column, value in cells.items():
        if table.get_cell(key, column) == value:
            continue
        grow = widen and _width(value) > table.columns[ColumnKey(column)].content_width
        table.update_cell(key, column, value, update_width=grow)


def _width(value) -> int:
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))


def _fmt(value, spec: str, dash: str = "-") -> str:
    return dash if value is None else format(value, spec)


class RankTable(DataTable):
    """Rank, state, position, loss, speed, input wait, workers, pid, device (most telling
    first, so a narrow terminal cuts the least useful columns)."""

    COLUMNS = ("rank", "state", "epoch/step", "loss", "img/s", "step ms", "step times", "wait",
               "workers", "pid", "device")
    # A script's ranks, seen from outside: their processes and the last line each printed.
    SCRIPT_COLUMNS = ("rank", "state", "epoch/step", "loss", "output", "process", "CPU", "RSS",
                      "GPU mem", "samples/s", "pid", "device")
    SPARK = 12  # cells of the step-time sparkline
    OUTPUT = 36  # characters of a rank's last line, where there is room
    OUTPUT_MIN = 16  # ... where there is not: the line is cut, not the columns after it
    can_focus = False
    output_room = OUTPUT
    _shown: RunView | None = None  # what was last drawn
    _order: list[str] = []  # the rows' keys, top to bottom, as last drawn

    def on_mount(self) -> None:
        self._rendered = CellCache()
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.script = False
        for name in self.COLUMNS:
            self.add_column(name, key=name)

    def show(self, view: RunView, selected: int, refit: bool = False,
             final: bool = False) -> None:
        """`refit`: measure the columns anew, as every rank is back at work (they only ever
        grow, and how far depended on which states happened to be drawn); `final`: once a run
        is over, to the widths its last figures need, now."""
        script = bool(view.meta.get("script"))
        columns = self.SCRIPT_COLUMNS if script else self.COLUMNS
        # Grouped: cells only for the ranks shown (the pinned ones and the open node's).
        layout = rank_groups.layout(view.ranks, selected)
        drawn = [r for r in layout if not isinstance(r, rank_groups.NodeRow)]
        rows = [self._script_cells(r, view.now) for r in drawn] if script else \
            self._cells(view, drawn)
        cells = dict(zip((r.rank for r in drawn), rows, strict=True))
        shown = [(rank_groups.key(row), rank_groups.node_cells(row, columns, STATE_STYLE)
                  if isinstance(row, rank_groups.NodeRow) else cells[row.rank]) for row in layout]
        if script != self.script or refit or final:  # a script's run has its own columns
            self.script = script
            self.clear(columns=True)
            self._order = []
            # Final: fixed widths (a table left to measure its new rows when the app is next
            # idle was caught mid-way by a snapshot under load); a fixed column would no longer
            # grow, so a run going on keeps measuring its own.
            widths = [max([cell_len(name), *(_width(row[i]) for _, row in shown)]) if final
                      else None for i, name in enumerate(columns)]
            for name, width in zip(columns, widths, strict=True):
                self.add_column(name, key=name, width=width)
        self._show_rows(shown, columns, str(selected))
        self._shown = view
        self._refit_output()

    def _render_cell(self, row_index: int, column_index: int, *args, **kwargs):
        """DataTable's cell, from the cache while it shows the same value in the same place."""
        if row_index < 0 or column_index < 0:  # the header, row labels: as DataTable has them
            return super()._render_cell(row_index, column_index, *args, **kwargs)
        row = self._row_locations.get_key(row_index)
        column = self._column_locations.get_key(column_index)
        key = (row_index, column_index, column, shown_as(self._data[row][column]), args,
               tuple(kwargs.items()), self._show_hover_cursor, self._pseudo_class_state)
        return self._rendered.get(key, lambda: super(RankTable, self)._render_cell(
            row_index, column_index, *args, **kwargs))

    def select(self, view: RunView, selected: int) -> None:
        """The cursor on `selected`: moved alone while the rows stay as they are (a key's whole
        cost; new figures made the table render every visible cell anew, 80 ms at 512 ranks),
        else the rows laid out again around it (a node opened or closed)."""
        keys = [rank_groups.key(row) for row in rank_groups.layout(view.ranks, selected)]
        if keys != self._order:
            self.show(view, selected)
        elif str(selected) in keys:
            self.move_cursor(row=keys.index(str(selected)))

    def _show_rows(self, shown: list[tuple[str, tuple]], columns: tuple[str, ...],
                   selected: str) -> None:
        """The rows in this order: updated in place where the order holds, else anew."""
        keys = [key for key, _ in shown]
        if keys != self._order:
            self.clear()
            for key, cells in shown:
                self.add_row(*cells, key=key)
            self._order = keys
        else:
            for key, cells in shown:  # widen as values grow ("-" at the first row, "12,937")
                update_row(self, key, dict(zip(columns, cells, strict=True)), widen=True)
        index = keys.index(selected) if selected in keys else 0
        if self.row_count and self.cursor_row != index:
            self.move_cursor(row=index)

    def on_resize(self) -> None:
        self._refit_output()  # the layout settles after the last rows came

    def _refit_output(self) -> None:
        view = self._shown
        if view is not None and self.script and self._fit_output():
            for r in view.ranks:  # the lines again, cut to the room they now have
                if str(r.rank) in self.rows:  # a closed node's ranks have none
                    update_row(self, str(r.rank), {"output": self._script_cells(r, view.now)[4]})

    def _fit_output(self) -> bool:
        """The output column takes the room the other columns leave, within OUTPUT_MIN and
        OUTPUT: at 160 columns the last ones (pid, device) were cut behind a 36-cell line.
        Whether its width changed."""
        column = self.columns.get(ColumnKey("output"))
        if column is None or not self.size.width:
            return False
        others = sum(c.get_render_width(self) for key, c in self.columns.items() if key != "output")
        room = self.size.width - others - 2 * self.cell_padding
        room = max(self.OUTPUT_MIN, min(self.OUTPUT, room))
        if not column.auto_width and column.width == room == self.output_room:
            return False
        self.output_room = column.width = room
        column.auto_width = False
        self._require_update_dimensions = True
        self.refresh()
        return True

    def _script_cells(self, r, now: float) -> tuple:
        stepped = bool(r.last_step_t)
        # Its colours as it printed them (only colours: keep_colours made the rest inert).
        out = Text.from_ansi(r.last_line, style="dim", no_wrap=True, end="")
        out.truncate(self.output_room, overflow="ellipsis")
        where = (str(r.step) if r.iteration else f"{r.epoch}/{r.step}") if stepped else "-"
        if r.state.is_final:  # its last readings are no process's now
            return (str(r.rank), state_cell(r, now), where, _fmt(r.loss, ".4f"), out,
                    Text("ended", style="dim"), "-", "-", "-", "-", str(r.pid or "-"),
                    r.device or "-")
        return (str(r.rank), state_cell(r, now), where, _fmt(r.loss, ".4f"), out,
                Text(r.status or "-", style="bold red" if r.status in ("stopped", "zombie")
                     else ""),
                _fmt(r.cpu_percent, ".0f") + ("%" if r.cpu_percent is not None else ""),
                _mib(r.rss), _mib(r.gpu_mem), _fmt(r.samples_per_s or None, ",.0f"),
                str(r.pid or "-"), r.device or "-")

    def _cells(self, view: RunView, ranks: list) -> list[tuple]:
        workers = view.settings.get("workers", "-")
        several_hosts = len({r.host for r in view.ranks if r.host}) > 1  # attach, multi-node
        # One scale for every rank, so the slow one's bars stand taller than the others'.
        times = [ms for r in view.ranks for ms in list(r.step_times)[-self.SPARK:]]
        lo, hi = (0.8 * min(times), max(times)) if times else (0.0, 1.0)
        rows = []
        for r in ranks:
            device = f"{r.host} {r.device}" if several_hosts else r.device
            current = r.state.is_member
            age = view.now - r.last_step_t if r.last_step_t else 0.0
            # A figure whose steps stopped coming says how old it is, never passes as current.
            stale = current and age > max(2.0, 3 * r.step_ms / 1000)
            rate = _fmt(r.samples_per_s if current else None, ",.0f")
            rows.append((
                str(r.rank), state_cell(r, view.now), f"{r.epoch}/{r.step}",
                _fmt(r.loss, ".4f"),
                Text(f"{rate} {age:.0f}s ago", style="dim") if stale else rate,
                _fmt(r.step_ms if current and not stale else None, ".1f"),
                spark(list(r.step_times), self.SPARK, lo, hi,
                      style="cyan" if current and not stale else "dim"),
                f"{100 * r.data_wait:.0f}%", str(workers), str(r.pid or "-"), device or "-"))
        return rows


# A script's joiner: its script runs up to run.elastic(), then the others form the world with it.
JOINER = {"preparing": "preparing", "prepared": "joining"}


# The most cells a state takes: a longer crash reason is cut (the events pane has it whole), as
# the column, which only grows while a run goes on, pushed the columns after it off the screen.
STATE_CELLS = 44


def state_cell(r, now: float) -> Text:
    """'stalled 12s', 'stopped · standby warming 4s', 'crashed (killed by SIGKILL) · ...',
    'restarting · preparing 3s'; a crash's reason cut to fit STATE_CELLS."""
    head, tail = r.state, ""
    if r.state.is_troubled and r.state_t:
        head += f" {now - r.state_t:.0f}s"
    if r.standby:
        tail = f" · {JOINER.get(r.standby, f'standby {r.standby}')}"
        if r.standby in ("warming", "preparing") and r.standby_t:
            tail += f" {now - r.standby_t:.0f}s"
    if r.state == "crashed" and r.reason:
        why = "killed by ddptui" if r.reason.startswith("killed by ddptui") else \
            r.reason.removeprefix("killed by ")  # "SIGKILL", or the exception's line
        head += f" ({_fit(why, STATE_CELLS - cell_len(head + tail) - 3)})"
    return Text(head + tail, style=STATE_STYLE.get(r.state, ""))


def _fit(why: str, room: int) -> str:
    """A crash's reason in `room` cells (8 at least): a signal's alone ('SIGKILL' of 'SIGKILL:
    killed with k'), else its start."""
    room = max(room, 8)
    if cell_len(why) <= room:
        return why
    if why.startswith("SIG") and cell_len(name := why.split(":")[0]) <= room:
        return name
    return why[:room - 1] + "…"


# Epoch rows drawn again each time: a row drawn before its last rank's figures came (a replay,
# a slow rank) is completed; older rows are final.
RECENT = 4


class EpochTable(DataTable):
    """Epoch, settings in force, throughput, input wait, losses, accuracy."""

    # Fixed widths: the table does not shift as the live row's figures grow or as rows go, and
    # usual labels ("12 ·1024-2048 quit") fit; a longer one is cut at the end. The epoch column
    # gives up to EPOCH_GIVES of its cells where the others would be cut ("b" for "bad").
    COLUMNS = {"epoch": 18, "prefetch": 8, "workers": 7, "bench": 5, "img/s": 7, "wait": 4,
               "loss": 7, "val_loss": 8, "val_acc": 7, "bad": 3, "ranks": 5}
    EPOCH_GIVES = 6
    # A script's rows with no settings of ours (its epochs read from its output, or sent by
    # ddptui.init() without run.loader()): its own figures take the settings' room.
    SCRIPT_COLUMNS = {"epoch": 18, "img/s": 8, "loss": 7, "val_loss": 8, "val_acc": 7,
                      "other figures": 24, "ranks": 5}
    can_focus = False

    def on_mount(self) -> None:
        self.zebra_stripes = True
        self.columns_now = self.COLUMNS
        for name, width in self.COLUMNS.items():
            self.add_column(name, key=name, width=width)

    def show(self, view: RunView) -> None:
        self.script = bool(view.meta.get("script"))
        self.cpu = view.meta.get("device_kind") == "cpu"
        live = view.live_epoch
        plain = self.script and not any(e["settings"] for e in [*view.epochs, live] if e)
        wanted = self.SCRIPT_COLUMNS if plain else self.COLUMNS
        if wanted is not self.columns_now:  # rows are added again below, in the new columns
            self.columns_now = wanted
            self.clear(columns=True)
            for name, width in wanted.items():
                self.add_column(name, key=name, width=width)
        self._fit_epoch()
        for e in view.epochs[-RECENT:]:  # a row drawn before every rank's part of it came
            if _row_key(e) in self.rows:
                update_row(self, _row_key(e), dict(zip(self.columns_now, self._cells(e),
                                                       strict=True)))
        new = [e for e in view.epochs if _row_key(e) not in self.rows]
        if "live" in self.rows and (new or live is None):  # the live row stays the last one
            self.remove_row("live")
        for e in new:
            self.add_row(*self._cells(e), key=_row_key(e))
        if live is not None and "live" in self.rows:
            update_row(self, "live", dict(zip(self.columns_now, self._live_cells(live),
                                              strict=True)))
        elif live is not None:
            self.add_row(*self._live_cells(live), key="live")
            new.append(live)
        if new:
            self.scroll_end(animate=False)

    def on_resize(self) -> None:
        self._fit_epoch()

    def _fit_epoch(self) -> None:
        column = self.columns.get(ColumnKey("epoch"))
        if column is None or not self.size.width:
            return
        others = sum(c.get_render_width(self) for key, c in self.columns.items() if key != "epoch")
        full = self.columns_now["epoch"]
        width = max(full - self.EPOCH_GIVES,
                    min(full, self.size.width - others - 2 * self.cell_padding))
        if column.width != width:
            column.width = width
            self._require_update_dimensions = True
            self.refresh()

    script = False  # a script's run: no settings, and rates only where it reports them
    cpu = False  # CPU ranks: no prefetcher (a CUDA side stream) runs there

    def _cells(self, e: dict) -> tuple:
        s = e["settings"]
        label = (f"r{e['restart']} " if e["restart"] else "") + str(e["epoch"])
        if e.get("at_step") is not None:  # a script with no epochs: its evaluation's row
            label = (f"r{e['restart']} " if e["restart"] else "") + f"step {e['at_step']}"
        elif e["start_step"] or e["partial"]:  # part of an epoch, cut by a change
            label += f" ·{e['start_step']}-{e['end_step']}"
        if e["at_quit"]:
            label += " quit"
        elif e["rolled_back"]:
            label += " rolled back"
        loss = (_fmt(e["train_loss"], ".4f"), _fmt(e["val_loss"], ".4f"),
                "-" if e["val_acc"] is None else f"{100 * e['val_acc']:.1f}%")
        if self.columns_now is self.SCRIPT_COLUMNS:
            return (label, _rate(e), *loss, figures(e).strip() or "-", str(e["world_size"]))
        return (label, *_setting_cells(s, e, self.script, self.cpu), *loss,
                str(e["bad_samples"]), str(e["world_size"]))

    def _live_cells(self, e: dict) -> tuple:
        """The running epoch so far: its progress and time, the mean img/s and input wait of
        its steps, the latest loss; validation and bad samples come at its end."""
        s, style = e["settings"], "italic"
        label = f"{e['epoch']}" + (f" ·{e['start_step']}-" if e["start_step"] else "") + \
            f" {100 * min(e['progress'], 1.0):.0f}% {duration(e['seconds'])}"
        if e.get("iteration"):  # no epochs to be a fraction of: the iteration it is at
            label = f"step {e['step']} {duration(e['seconds'])}"
        if self.columns_now is self.SCRIPT_COLUMNS:
            cells = (label, _rate(e), _fmt(e["loss"], ".4f"), "…", "…", "…",
                     str(e["world_size"] or "-"))
        else:
            cells = (label, *_setting_cells(s, e, self.script, self.cpu), _fmt(e["loss"], ".4f"),
                     "…", "…", "…", str(e["world_size"] or "-"))
        return tuple(Text(c, style=style) for c in cells)


def _row_key(e: dict) -> str:
    return f"{e['restart']}:{e['epoch']}:{e['start_step']}"


def _rate(e: dict) -> str:
    """Samples a second, else the iterations a second a script's printed steps give."""
    if e.get("samples_per_s"):
        return f"{e['samples_per_s']:,.0f}"
    return f"{e['steps_per_s']:.1f}it/s" if e.get("steps_per_s") else "-"


def _setting_cells(settings: dict, e: dict, script: bool, cpu: bool) -> tuple:
    """prefetch, workers, bench, img/s, wait: a script has no settings of ours to show."""
    if script and not settings:
        return ("-", "-", "-", _rate(e), "-")
    wait = e.get("data_wait")
    return ("n/a" if cpu else onoff(settings.get("prefetch")), onoff(settings.get("workers")),
            onoff(settings.get("cudnn_benchmark")), _fmt(e.get("samples_per_s"), ",.0f"),
            "-" if wait is None else f"{100 * wait:.0f}%")


def _mib(mib: int | None) -> str:
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f}G" if mib >= 1024 else f"{mib}M"

