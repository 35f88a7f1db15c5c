"""The Textual dashboard: header, per-device bars, ranks, charts, epochs and events, redrawn a
few times a second from the run state (the charts once a second); keys steer the run through the
supervisor, never block.
"""

from __future__ import annotations

import gc
import os
import time

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Footer

from ddptui.contract.keys import KEYS, key_rows
from ddptui.contract.socket.viewers import STACKS_FRESH_S
from ddptui.contract.state.capabilities import STEERING
from ddptui.contract.state.source import RunSource
from ddptui.contract.state.views import RunView
from ddptui.contract.wording import onoff
from ddptui.dashboard.view.rank_keys import RankKeys
from ddptui.dashboard.view.screens.confirm import ConfirmQuit
from ddptui.dashboard.view.screens.gpus import GpuScreen
from ddptui.dashboard.view.screens.heat_screen import HeatScreen
from ddptui.dashboard.view.screens.help import HelpScreen
from ddptui.dashboard.view.screens.stacks_screen import StacksScreen
from ddptui.dashboard.view.screens.steptime_screen import StepTimeScreen
from ddptui.dashboard.view.widgets import rank_groups
from ddptui.dashboard.view.widgets.charts import RunCharts
from ddptui.dashboard.view.widgets.devices import DevicePanel
from ddptui.dashboard.view.widgets.events_pane import EventLog
from ddptui.dashboard.view.widgets.header import RunHeader
from ddptui.dashboard.view.widgets.tables import EpochTable, RankTable

REFRESH_S = 0.2
WIDE = 140  # columns from which the tables take more of the width than the GPUs and charts
GC_THRESHOLDS, GC_PYTHONS = (50_000, 20, 20), gc.get_threshold()  # see on_mount
CHARTS_S = 1.0  # a chart spans minutes: redrawing it (~25 ms) more often shows nothing new
# The tables' figures (loss, img/s per rank) at 2 Hz: a table renders all its rows anew at each
# change, and at 5 Hz that was a third of the dashboard's CPU. States and rows show at once.
TABLES_S = 0.5
# A row a node (hundreds of ranks): their ranks report once a second (contract/rollup.py), so
# once a second shows each second whole, at half the cost (80 ms a redraw at 512 ranks).
GROUPED_TABLES_S = 1.0
BELL_STATES = ("stalled", "crashed")
LEVEL_STYLE = {"warning": "yellow", "error": "bold red"}
_ACTION_OF = {key: k.action.split("(")[0] for k in KEYS for key in k.keys.split(",")}
# The footer's order: q and ? first, so a narrow terminal cuts the least used keys instead
# (at 160 columns it ended "c Chec▏^p palette": no way out of a finished run was shown).
_FOOTER_FIRST = ("q", "question_mark")
_WORKERS = Binding.Group("Workers", compact=True)  # w W Workers: one place for the pair


def _binding(k) -> Binding:
    group = _WORKERS if k.action.startswith("workers") else None
    return Binding(k.keys, k.action, k.label, show=k.footer, group=group)


class DashboardApp(RankKeys, App[int]):
    """Shows any RunSource: a run ddptui owns, an attach, a replay; `source.state` is the
    RunState, and the source's flags say which keys apply."""

    CSS_PATH = "ddptui.tcss"
    TITLE = "ddptui"
    BINDINGS = [*(_binding(k) for k in sorted(KEYS, key=lambda k: k.keys not in _FOOTER_FIRST)),
                Binding("ctrl+c", "quit", "Quit", show=False, priority=True)]

    selected_rank: reactive[int] = reactive(0)

    def __init__(self, source: RunSource, refresh_s: float = REFRESH_S):
        super().__init__()
        self.source = source
        self.read_only = source.read_only  # a Viewer's (ddptui web's tab without --control)
        self.refresh_s = refresh_s
        self.view: RunView | None = None
        self.quitting = False
        self.detached = False  # d: the run goes on without this dashboard
        self.closing = False
        self._seq = 0
        self._stacks_asked_t = 0.0
        self._tables: tuple = (0.0, None)  # when the tables were last filled, and from what
        self._told_failed = False  # a script's failure was announced (r restarts it)
        self._rung: dict | None = None  # the stalled and crashed ranks last seen (the bell)
        self._disabled: frozenset[str] = frozenset()  # actions whose keys are dimmed
        self._drawn_over = False  # the tables were drawn once the source was done

    @property
    def crashed(self) -> bool:
        """An exception ended the app (Textual prints its traceback as it exits)."""
        return self.return_code == 1

    def compose(self) -> ComposeResult:
        # Kept as attributes: while a modal (help, confirm) is on top, queries would search it.
        self.header, self.devices = RunHeader(), DevicePanel()
        self.rank_table, self.charts, self.epoch_table = RankTable(), RunCharts(), EpochTable()
        self.events = EventLog()
        yield self.header
        with Horizontal(id="top"):
            yield _boxed(self.devices, "GPUs")
            yield _boxed(self.rank_table, "ranks")
        with Horizontal(id="bottom"):
            yield _boxed(self.charts, "loss · img/s and input wait")
            # The epochs table is as tall as its rows; the events take what is left beside the
            # charts (a full-width pane of 5 lines under a table of 3 rows left half empty).
            with Vertical(id="side"):
                yield _boxed(self.epoch_table, "epochs")
                yield _boxed(self.events, "events")
        yield Footer(show_command_palette=False)  # ctrl+p still opens it

    def on_resize(self) -> None:
        # Below 100 columns the charts give their room to the tables; with many devices or few
        # rows, each device gets one line.
        self.set_class(self.size.width < 100, "-narrow")
        self.set_class(self.size.width >= WIDE, "-wide")
        self.call_after_refresh(self.refresh_charts)

    def on_mount(self) -> None:
        self.on_resize()
        self.header.read_only = self.read_only
        self.source.start()
        self.refresh_view()
        self.set_interval(self.refresh_s, self.refresh_view)
        self.set_interval(CHARTS_S, self.refresh_charts)
        # Everything built so far (modules, widgets, styles) lives as long as the app: kept out
        # of the collector's full passes, which otherwise walk it all and stall a key ~100 ms.
        gc.freeze()
        # Each view's copies (512 ranks' rows, 5 a second) caught alive by young collections set
        # off a full pass (70-170 ms, every thread stopped) about once a second: the slow keys.
        # Young collections 70 times rarer let the copies die by their count first.
        gc.set_threshold(*GC_THRESHOLDS)

    def on_unmount(self) -> None:
        gc.set_threshold(*GC_PYTHONS)  # the process may go on (a test, a run past its screen)

    def refresh_charts(self) -> None:
        if self.closing or not self.screen_stack or not self.charts.display:
            return
        self.charts.show(self.source.state.charts())

    def refresh_view(self) -> None:
        """Pull a snapshot of the run state and hand it to the widgets."""
        if self.closing or not self.screen_stack:  # an interval can still fire at teardown
            return
        if self.source.done.is_set() and (self.quitting or isinstance(self.screen, ConfirmQuit)):
            # q was pressed: once the run has ended, by the agreed stop or by itself while
            # "End the run?" was still asked, there is nothing left to ask.
            self._close(self.source.exit_code)
            return
        state = self.source.state
        view = self.view = state.view()
        self._refresh_keys()
        self.header.view = view
        self._show_devices(view)
        self._show_tables(view)
        self._ring(view)
        screen = self.screen
        if isinstance(screen, GpuScreen):
            screen.view = view
        if isinstance(screen, StacksScreen):
            rank = next((r for r in view.ranks if r.rank == screen.rank), None)
            if rank is not None and rank.stacks_t >= self._stacks_asked_t:
                screen.stacks = rank.stacks
        if view.status == "failed" and not self.source.done.is_set() and \
                self.source.capabilities.restarts_group("r"):
            # A script's run that failed waits on screen: r may start it again.
            if not self._told_failed:
                self.notify(f"{view.reason}\nr starts every rank again; q quits",
                            severity="error", timeout=30)
            self._told_failed = True
        elif view.status != "failed":
            self._told_failed = False
        pending = ", ".join(f"{k} {onoff(v)}" for k, v in view.pending.items())
        _title(self.epoch_table, f"epochs · pending: {pending} (next epoch; a: now)"
               if pending else "epochs")
        start = state.started_t
        for seq, t, level, text, _kind in state.lines_after(self._seq):
            self._seq = seq
            stamp = f"{t - start:7.1f}s " if start else "         "
            self.events.write(Text(stamp + text, style=LEVEL_STYLE.get(level, "")))

    def _show_tables(self, view: RunView) -> None:
        """At most every TABLES_S of run time (a row a node: GROUPED_TABLES_S), or when a rank's
        state or the epochs changed; once no more events can come (a run that has ended, a
        replay played out), the final state once more: a draw just before the end would
        otherwise stay on screen (a snapshot test caught a sparkline in the wrong colour). The
        last events can be drawn before done is set (a replay's clock then stands still): the
        first draw once it is set is always made, measuring the columns anew."""
        shape = (tuple((r.rank, r.state, r.standby) for r in view.ranks), len(view.epochs),
                 view.live_epoch is None)
        over = self.source.done.is_set()
        changed = shape != self._tables[1]
        every = GROUPED_TABLES_S if rank_groups.grouped(view.ranks) else TABLES_S
        if not (view.now - self._tables[0] >= every or changed or
                (over and (view.now != self._tables[0] or not self._drawn_over))):
            return
        # Every rank back at work after a change: the columns, which only grow, are measured
        # anew, so a state that was long (a crash and its standby) does not keep its room.
        calm = changed and all(r.state == "running" and not r.standby for r in view.ranks)
        self._tables, self._drawn_over = (view.now, shape), over
        self.rank_table.show(view, self.selected_rank, refit=calm, final=over)
        self.epoch_table.show(view)

    def _ring(self, view: RunView) -> None:
        """The terminal bell, once, for each rank that stalls or crashes while this dashboard
        watches (DDPTUI_BELL=0: never); what had happened before it opened rings nothing."""
        rung = {r.rank: (r.state, r.state_t) for r in view.ranks if r.state in BELL_STATES}
        if self._rung is not None and set(rung.items()) - set(self._rung.items()) and \
                os.environ.get("DDPTUI_BELL", "1") != "0" and self.source.can_steer:
            self.bell()
        self._rung = rung

    def _show_devices(self, view: RunView) -> None:
        self.devices.over = self.source.done.is_set()
        self.devices.view = view
        _title(self.devices, "GPUs" if view.meta.get("device_kind") == "cuda" else
               "CPU ranks and host")
        self.devices.compact = len(view.devices) > 4 or self.size.height < 30

    def _refresh_keys(self) -> None:
        """The footer dims the keys that cannot act, once a script's ranks said what they take,
        and drops the steering keys once the run is over."""
        can = self.source.capabilities
        disabled = frozenset(a for a in STEERING if can.why_not(a))
        if disabled != self._disabled:
            self._disabled = disabled
            self.refresh_bindings()

    def _close(self, code: int | None) -> None:
        self.closing = True
        self.exit(code)

    # -- keys -------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in STEERING and (not self.source.can_steer or self.source.done.is_set()):
            return False  # a replay, or a run that is over, has nothing to steer: hidden
        if action == "end_job" and not self.source.can_end_job:
            return False  # a run ddptui owns: q ends it
        if action == "detach" and (not self.source.can_detach or self.source.done.is_set()):
            return False  # nothing goes on without this dashboard
        return None if self.why_not(action) else True  # dimmed in the footer

    def why_not(self, action: str) -> str | None:
        """Why a key's action cannot act in the run on screen (a script that takes no pause, no
        --checkpoint-dir, an attach, a run that is over), or None."""
        return self.source.capabilities.why_not(action)

    def on_key(self, event) -> None:
        """A dimmed key is not bound for Textual: say why it cannot act."""
        action = _ACTION_OF.get(event.key)
        if action and self.screen is self.screen_stack[0] and self.source.can_steer:
            why = self.why_not(action)
            if why:
                self.notify(why, severity="warning")

    def action_select(self, delta: int) -> None:
        ranks = rank_groups.order(self._ranks())
        if ranks:
            i = ranks.index(self.selected_rank) if self.selected_rank in ranks else 0
            self.selected_rank = ranks[max(0, min(len(ranks) - 1, i + delta))]

    def watch_selected_rank(self, rank: int) -> None:
        if self.view is not None:
            self.rank_table.select(self.view, rank)

    def action_pause(self) -> None:
        if not self._can_steer("pause"):
            return
        # What was last asked for, if the ranks are not there yet: space space is pause, resume.
        p = self.source.state.vitals()
        if p.paused if p.pause_asked is None else p.pause_asked:
            self.source.resume()
            self.notify("resuming every rank")
        else:
            self.source.pause()
            self.notify("pausing every rank at the next agreed step")

    def action_toggle(self, name: str) -> None:
        if self._can_steer("settings"):
            value = not self._desired().get(name, False)
            self.source.change_settings(**{name: value})

    def action_workers(self, delta: int) -> None:
        if self._can_steer("settings"):
            workers = max(0, int(self._desired().get("workers", 0)) + delta)
            self.source.change_settings(workers=workers)

    def action_stacks(self) -> None:
        rank = self._selected()
        if rank is None:
            return
        asked = self.source.can_steer and not self.source.done.is_set() and not rank.state.is_final
        screen = StacksScreen(rank.rank, asked)
        if asked:  # what another dashboard asked for just before is this ask's answer too
            self._stacks_asked_t = self.view.now - STACKS_FRESH_S if self.view else 0.0
            self.source.stacks(rank.rank)
        else:  # a replay, or a rank with no live process: the last stacks taken, if any
            self._stacks_asked_t = 0.0
            screen.stacks = rank.stacks
        self.push_screen(screen)

    def action_heat(self) -> None:
        self.push_screen(HeatScreen(self.source.state))

    def action_steptime(self) -> None:
        self.push_screen(StepTimeScreen(self.source.state))

    def action_gpus(self) -> None:
        screen = GpuScreen()
        screen.view = self.view
        self.push_screen(screen)

    def action_apply(self) -> None:
        if not self._can_steer("settings"):
            return
        if not self.source.state.vitals().pending:
            self.notify("nothing pending: change a setting with p, w/W or b first",
                        severity="warning")
            return
        self.source.apply_now()
        self.notify("pending settings apply at the next agreed step")

    def action_checkpoint(self) -> None:
        if not self._can_steer("checkpoint"):
            return
        self.source.checkpoint()
        self.notify("checkpoint requested")

    def action_detach(self) -> None:
        self.detached = True
        self.source.close()
        self._close(None)

    def action_help(self) -> None:
        can = self.source.capabilities
        self.push_screen(HelpScreen(key_rows(can.why_not, can.restarts_group)))

    async def action_quit(self) -> None:
        if self.read_only:  # it has nothing to end: it leaves
            self.action_detach()
            return
        if self.source.done.is_set() or not self.source.can_steer or not self.source.owns_ranks:
            # Nothing of ours to stop: a replay, a finished run, or an attach (which detaches).
            self.source.stop()
            self._close(self.source.exit_code)
            return
        if self.quitting:  # asked twice: end everything now
            self.source.stop()
            return
        last = self.view.checkpoint_t if self.view else None
        age = None if last is None else time.time() - last
        checkpoints = bool(self.view and self.view.meta.get("checkpoint_dir"))
        if self.source.can_detach or checkpoints and (age is None or age > 60):
            self.push_screen(ConfirmQuit(age, checkpoints, self.source.can_detach),
                             self._confirmed)
        else:
            self._begin_quit()

    def _confirmed(self, answer: str | None) -> None:
        if answer == "quit":
            self._begin_quit()
        elif answer == "detach":
            self.action_detach()

    def _begin_quit(self) -> None:
        self.quitting = True
        self.source.stop()
        self.notify("stopping: every rank finishes its step, then every process ends")

    def _can_steer(self, action: str | None = None) -> bool:
        if not self.source.can_steer or self.source.done.is_set() or self.quitting:
            return False
        why = self.source.capabilities.why_not(action) if action else None
        if why:
            self.notify(why, severity="warning")
        return why is None

    def _desired(self) -> dict:
        """The settings asked for so far, read from the state rather than the last drawn view:
        keys pressed in quick succession (W W, W a) each see the one before."""
        v = self.source.state.vitals()
        return {**v.settings, **v.pending}


def _boxed(widget, title: str):
    widget.add_class("box")
    widget.border_title = title
    return widget


def _title(widget, title: str) -> None:
    """A border's title, set only if it changed: each set repaints the widget (the GPU panel at
    64 nodes: 10 ms, five times a second)."""
    if widget.border_title != title:
        widget.border_title = title
