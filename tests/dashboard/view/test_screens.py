"""What the dashboard draws, from made-up logs with a real log's schema: snapshots at 80x24,
120x40 and 160x50 of a live run, a run with a stopped and a crashed rank, and 8 ranks; the
charts' axes, the live epoch row, the step-time sparklines, the GPU screen; the charts' axis
labels read back from a real terminal (tmux)."""

from __future__ import annotations

import html
import json
import re
import shutil
import sys
import threading
import time

import pytest
from textual.widgets.data_table import ColumnKey

from ddptui.contract.console import status_line, summary
from ddptui.contract.protocol.events import PARENT
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.views import RankView
from ddptui.contract.states import RankState
from ddptui.dashboard.sources.replay import Replay
from ddptui.dashboard.view.app import DashboardApp
from ddptui.dashboard.view.screens.gpus import GpuScreen
from ddptui.dashboard.view.widgets.bars import SPARKS
from ddptui.dashboard.view.widgets.tables import state_cell
from tests.helpers.runlogs import cluster_run, gpu_run, logged, script_run, typed
from tests.helpers.runs import ROOT
from tests.helpers.screens import end_tmux, fixed_hash, settle, tmux

SCENES = {
    "live": dict(ranks=2),  # no end: RUNNING, with the current epoch's live row
    "stopped-crashed": dict(ranks=4, trouble=True),
    "eight-ranks": dict(ranks=8, finished=True),
}
SIZES = [(80, 24), (120, 40), (160, 50)]


def _app(scene: str) -> DashboardApp:
    return DashboardApp(Replay(scene, speed=0, events=gpu_run(**SCENES[scene])))


def _text(app: DashboardApp) -> str:
    """The screen as plain text, the way a terminal would show it: read back from Textual's
    SVG screenshot, where each run of text sits at x = (column + 1) x the cell width."""
    svg = app.export_screenshot()
    rows = [[" "] * app.size.width for _ in range(app.size.height)]
    cell = None
    for x, line, text in re.findall(r'<text class="[\w-]+-r\d+" x="([\d.]+)" y="[\d.]+" '
                                    r'textLength="[\d.]+" clip-path="url\(#[\w-]+-line-(\d+)\)"'
                                    r'>([^<]*)</text>', svg):
        cell = cell or float(x)  # the first run starts at column 0
        text = html.unescape(text).replace("\xa0", " ")
        column = round(float(x) / cell) - 1
        rows[int(line)][column:column + len(text)] = list(text)
    return "\n".join("".join(r).rstrip() for r in rows) + "\n"


@fixed_hash
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("scene", list(SCENES))
def test_snapshot(snap_compare, scene, size):
    assert snap_compare(_app(scene), terminal_size=size, run_before=settle)


async def _gpu_screen_drawn(pilot) -> None:
    """The GPU screen's cards mounted, sized, and their charts built (on threads)."""
    for _ in range(3):
        pilot.app.refresh_view()
        await pilot.pause(0.2)
        await pilot.app.workers.wait_for_complete()
    await pilot.pause(0.2)


@fixed_hash
@pytest.mark.parametrize("size", [(80, 24), (160, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_cluster_snapshot(snap_compare, size):
    """64 ranks on 8 nodes: a row a node, the stalled rank pinned on top, rank 0's node open,
    the slow node's img/s lower, a line a node in the GPU panel (one GPU held down, one idle)."""
    app = DashboardApp(Replay("cluster", speed=0, events=cluster_run()))
    assert snap_compare(app, terminal_size=size, run_before=settle)


def _script_app() -> DashboardApp:
    return DashboardApp(Replay("script", speed=0, events=script_run()))


@fixed_hash
@pytest.mark.parametrize("size", [(120, 40), (160, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_script_snapshot(snap_compare, size):
    assert snap_compare(_script_app(), terminal_size=size, run_before=settle)


async def test_a_scripts_ranks_show_their_process_output_and_who_waits_for_whom():
    app = _script_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        columns = [str(c.label) for c in app.rank_table.ordered_columns]
        assert columns[:6] == ["rank", "state", "epoch/step", "loss", "output", "process"]
        rows = [dict(zip(columns, map(str, app.rank_table.get_row_at(i)), strict=True))
                for i in range(2)]
        assert rows[1]["state"].startswith("stalled") and rows[1]["process"] == "stopped"
        assert rows[0]["state"].startswith("waiting") and rows[0]["GPU mem"] == "20.0G"
        assert rows[1]["output"].startswith("rank 1 epoch 2 step ")
        screen = _text(app)
        assert "train.py --lr 0.1 · 2 × GPU" in screen and "waiting for" in screen
        assert any("waiting for rank 1" in text for *_, text, _kind in app.source.state.lines_after(0))
        # A script with no settings of ours: its own figures take the settings' columns.
        labels = [str(c.label) for c in app.epoch_table.ordered_columns]
        assert labels == ["epoch", "img/s", "loss", "val_loss", "val_acc", "other figures", "ranks"]
        losses = [str(app.epoch_table.get_row_at(i)[2]) for i in range(app.epoch_table.row_count)]
        assert losses[:2] == ["1.4950", "0.9461"]


@fixed_hash
def test_gpu_screen_snapshot(snap_compare):
    async def open_gpus(pilot):
        await settle(pilot)
        await pilot.press("g")
        await _gpu_screen_drawn(pilot)

    assert snap_compare(_app("eight-ranks"), terminal_size=(160, 50), run_before=open_gpus)


async def test_eight_ranks_fit_at_120x40_with_charts_that_have_axes():
    app = _app("eight-ranks")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        screen = _text(app)
        for rank in range(8):  # every rank's row and every GPU's line is on the screen
            assert f"GPU {rank} " in screen
        assert app.rank_table.row_count == 8
        assert app.rank_table.region.height >= 8 + 1  # header and eight rows, none scrolled off
        # The charts: labelled axes, time on x from the launch to the end (126 s = 02:06).
        for label in ("loss", "img/s", "time since launch", "00:00", "02:06"):
            assert label in screen, label
        # The slow rank's step-time sparkline stands taller than the others'.
        heights = {r: _mean_height(app.rank_table.get_row_at(r)[6]) for r in range(8)}
        assert heights[2] == max(heights.values()) and heights[2] > heights[0]


def _mean_height(cell) -> float:
    blocks = [SPARKS.index(c) for c in str(cell) if c in SPARKS]
    return sum(blocks) / len(blocks)


async def test_the_running_epoch_has_a_live_row_that_a_finished_run_does_not():
    app = _app("live")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        last = [str(c) for c in app.epoch_table.get_row_at(app.epoch_table.row_count - 1)]
        # 125 s into 50 s epochs: epoch 2, 40% done, 20 s in; img/s and the latest loss so far.
        assert last[0].startswith("2 40% 00:2")
        assert float(last[4].replace(",", "")) > 0 and float(last[6]) > 0
        assert last[7] == "…"  # validation comes at the epoch's end
        # One numbering: the header, the table, the console (it said "epoch 3/4" beside row 2).
        assert "epoch 2 of 0-3 " in _text(app).splitlines()[1]
        assert status_line(app.source.state.view()).startswith("[02:05] epoch 2 of 0-3 step 80 ")
    done = _app("eight-ranks")
    async with done.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        labels = [str(done.epoch_table.get_row_at(i)[0]) for i in range(done.epoch_table.row_count)]
        assert labels == ["0", "1"]


def test_the_exit_line_of_a_run_no_rank_reported_to_says_so():
    """An attach stopped before any rank came said "starting in 0.0 s: 0 epochs, best val_acc -"."""
    assert summary(RunState({"log": "runs/a.jsonl"}).view()) == \
        "starting: no rank reported; log runs/a.jsonl"


class Steerable(Replay):
    """A replay that steers as a run ddptui owns, and plays into a run that goes on."""

    can_steer = owns_ranks = True

    def __init__(self, events: list[dict]):
        super().__init__("steerable", speed=0, events=events)
        self.played = threading.Event()

    def _play(self) -> None:
        super()._play()
        self.done.clear()  # the run goes on
        self.played.set()


async def _drawn(pilot) -> None:
    app = pilot.app
    while not app.source.played.is_set():
        await pilot.pause(0.05)
    for _ in range(3):
        app.refresh_view()
        await pilot.pause(0.2)


def _footer(app) -> str:
    return " ".join(f"{k.key_display} {k.description}" for k in app.screen.query("FooterKey")
                    if k.region.right <= app.size.width and k.region.width)


@pytest.mark.parametrize("width", [100, 160])
async def test_the_footer_always_shows_help_and_quit_and_a_finished_run_no_steering(width):
    """At 160 columns the footer ended "a Apply now  c Chec▏^p palette": neither ? nor q was
    visible in a live run, and a finished run showed steering keys and no way out."""
    app = DashboardApp(Steerable(gpu_run(ranks=2)))
    async with app.run_test(size=(width, 40), notifications=True) as pilot:
        await _drawn(pilot)
        live = _footer(app)
        assert live.startswith("? Help q Quit s Stop rank r Restart rank k Kill rank t Stacks"), live
        if width == 160:
            assert live.endswith("c Checkpoint")  # every key
        app.source.done.set()
        app.refresh_view()
        await pilot.pause(0.3)
        assert _footer(app) == "? Help q Quit t Stacks g GPU detail"
        await pilot.press("s")
        await pilot.pause(0.1)
        assert any("the run is over: q quits" in str(t.render()) for t in app.screen.query("Toast"))


@pytest.mark.parametrize("scene", ["live", "script"])
async def test_every_column_of_both_tables_fits_at_160(scene):
    """A script's ranks table showed "pid de" (device cut behind a 36-cell output line), the
    epochs table "b" for its bad-samples column."""
    app = _script_app() if scene == "script" else _app("live")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        for table in (app.rank_table, app.epoch_table):
            assert table.virtual_size.width <= table.size.width, table
        shown = _text(app)
        assert ("samples/s  pid  device" if scene == "script" else "pid   device") in shown
        assert ("other figures" if scene == "script" else "val_acc  bad  ranks") in shown


async def test_stopped_and_crashed_ranks_say_so_and_the_charts_mark_the_changes():
    app = _app("stopped-crashed")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        states = [str(app.rank_table.get_row_at(i)[1]) for i in range(4)]
        assert states == ["running", "stopped · standby ready", "running",
                          "crashed (SIGKILL) · standby warming 60s"]
        charts = app.source.state.charts()
        assert [label for _, label in charts["marks"]] == ["world 3", "world 2", "prefetch"]


def test_a_scripts_joiner_is_shown_preparing_then_joining():
    joiner = RankView(1, RankState.RESTARTING, standby="preparing", standby_t=100.0)
    assert str(state_cell(joiner, now=103.2)) == "restarting · preparing 3s"
    joiner.standby = "prepared"
    assert str(state_cell(joiner, now=104.0)) == "restarting · joining"


def test_a_long_crash_reason_is_cut_in_the_state_column_and_its_standby_still_shown():
    """The rank table's columns only grow while a run goes on: a state as long as its crash's
    reason pushed the columns after it off a 160-column screen after one `k` (tried: 53 cells,
    "crashed (SIGKILL: killed with k) · standby warming 2s"). The events pane has it whole."""
    killed = RankView(1, RankState.CRASHED, reason="killed by SIGKILL: killed with k",
                      standby="warming", standby_t=100.0)
    assert str(state_cell(killed, now=102.0)) == "crashed (SIGKILL) · standby warming 2s"
    killed.standby = ""
    assert str(state_cell(killed, now=102.0)) == "crashed (SIGKILL: killed with k)"
    failed = RankView(1, RankState.CRASHED, standby="ready",
                      reason="RuntimeError: CUDA error: an illegal memory access was encountered")
    cell = str(state_cell(failed, now=0.0))
    assert cell.startswith("crashed (RuntimeError: CU") and cell.endswith("…) · standby ready")
    assert len(cell) <= 44


def test_a_finished_run_shows_no_standby_and_says_a_ranks_end_once():
    """Tried in tmux: a run that ended while rank 1's standby warmed (r pressed just before the
    last epoch) kept "crashed (SIGKILL) · standby warming 1s" on its final screen, the standby
    long gone; and the events pane said "rank 0 done" twice (the rank's word, then ddptui's
    at its exit)."""
    state = RunState({"script": "x.py"})
    for ev in (logged("run", PARENT, status="started", world_size=2),
               logged("rank", 0, state="running"), logged("rank", 1, state="running"),
               logged("rank", 1, state="crashed", reason="killed by SIGKILL: killed with k",
                     standby="warming"),
               logged("rank", 0, state="done"), logged("rank", 0, state="done", exit_code=0),
               logged("run", PARENT, status="done", exit_code=0)):
        state.apply(ev)
    view = state.view()
    assert str(state_cell(view.ranks[1], now=view.now)) == "crashed (SIGKILL: killed with k)"
    said = [text for _, _, _, text, _ in state.lines_after(0)]
    assert said.count("rank 0 done") == 1 and said[-1] == "run done"


class Gated(Replay):
    """A replay that stops after each part of its events until the test lets it go on: a run
    seen in the middle, not over (the final draw measures every column anew anyway)."""

    def __init__(self, parts: list[list[dict]]):
        super().__init__("gated", speed=0, events=[])
        self.parts, self.gates = parts, [threading.Event() for _ in parts]
        self.played = [threading.Event() for _ in parts]

    def _read(self):
        for part, played, gate in zip(self.parts, self.played, self.gates, strict=True):
            yield from map(typed, part)
            played.set()
            gate.wait(60)


async def test_the_state_column_gives_back_a_crashs_room_once_every_rank_runs_again():
    """After `k` and `r` the state column kept the width of 'crashed (SIGKILL) · standby warming
    2s' for the rest of the run: the columns after it stayed pushed off a 160-column screen. The
    column measured anew still grows for a longer state (a first try of this fixed its width:
    'stopped · standby ready' showed as 'stopped')."""
    run = gpu_run(ranks=2, seconds=20)
    crash_t = run[-1]["t"] + 1
    down = [{"t": crash_t, "kind": "rank", "rank": 1, "state": "crashed", "standby": "warming",
             "reason": "killed by SIGKILL: killed with k"}]
    back = [{"t": crash_t + 5, "kind": "rank", "rank": 1, "state": "running", "pid": 4009}]
    stopped = [{"t": crash_t + 9, "kind": "rank", "rank": 1, "state": "stopped",
                "standby": "ready"}]
    source = Gated([run + down, back, stopped])
    app = DashboardApp(source)
    async with app.run_test(size=(160, 50)) as pilot:
        widths = []
        for part in range(3):
            while not source.played[part].is_set():
                await pilot.pause(0.05)
            for _ in range(3):
                app.refresh_view()
                await pilot.pause(0.1)
            widths.append(app.rank_table.columns[ColumnKey("state")].get_render_width(
                app.rank_table))
            assert not source.done.is_set()  # the run goes on: no end-of-run measuring
            source.gates[part].set()
    assert widths[0] >= len("crashed (SIGKILL) · standby warming 2s")
    assert widths[1] < len("crashed (SIGKILL)")
    assert widths[2] >= len("stopped · standby ready")  # and it grows again when it must


async def test_the_gpu_screen_shows_history_clocks_traffic_and_other_processes():
    app = _app("eight-ranks")
    async with app.run_test(size=(160, 50)) as pilot:
        await settle(pilot)
        await pilot.press("g")
        await _gpu_screen_drawn(pilot)
        assert isinstance(app.screen, GpuScreen)
        screen = _text(app)
        for text in ("GPU 7", "SM 1980 / mem 3201 MHz", "NVLink rx 21,000", "PCIe rx 410",
                     "clocks held down: power cap", "alice", "python3", "91234", "-5m", "now"):
            assert text in screen, text
        await pilot.press("escape")
        assert not isinstance(app.screen, GpuScreen)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_chart_axes_in_a_real_terminal(tmp_path):
    log = tmp_path / "eight.jsonl"
    log.write_text("".join(json.dumps(ev) + "\n" for ev in gpu_run(ranks=8, finished=True)))
    session = f"ddptui-charts-{time.monotonic_ns()}"
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50",
         f"cd {ROOT} && env -u COLUMNS -u LINES {sys.executable} -m ddptui replay {log} "
         "--speed 0; sleep 30")
    try:
        deadline, screen = time.monotonic() + 60, ""
        wanted = ("time since launch", "00:00", "02:06", "loss", "img/s", "DONE")
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-p", "-t", session, check=False)
            if all(w in screen for w in wanted):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the charts' axis labels never showed:\n{screen}")
        # y axis of the img/s chart: ticks in thousands up to the run's ~23k img/s on 8 ranks.
        assert any(f"{k}.{d}k" in screen for k in range(20, 27) for d in range(10))
        tmux("send-keys", "-t", session, "q")
    finally:
        end_tmux(session)


def test_the_loss_axis_of_one_point_reads_in_four_figures():
    """A script that printed one loss so far (6.265) got plotext's own ticks:
    6.2650000000000006."""
    import plotext

    from ddptui.dashboard.view.widgets.charts import draw_loss

    draw_loss(plotext, {"loss": {0: [(3.0, 6.265)]}, "marks": []}, 60.0, 40)
    plotext.plotsize(60, 20)
    shown = plotext.build()
    assert "6.265" in shown and "6.2650000000000006" not in shown
    labels = [word for word in plotext.uncolorize(shown).split() if word.endswith("┤")]
    assert labels and all(len(w.rstrip("┤").lstrip("│")) <= 6 for w in labels), labels
