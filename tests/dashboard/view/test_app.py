"""The dashboard driven like a user drives it: Pilot key presses against replayed logs and a
real 2-rank CPU run, SVG snapshots of the layout, and responsiveness under a flood of events."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from ddptui.contract.socket.viewer import Viewer
from ddptui.contract.state.source import RunSource
from ddptui.dashboard.sources.attach import Attach
from ddptui.dashboard.sources.replay import Replay
from ddptui.dashboard.view.app import DashboardApp
from ddptui.dashboard.view.screens.help import HelpScreen
from ddptui.dashboard.view.widgets.tables import EpochTable, RankTable
from ddptui.run.builtin.supervisor import Supervisor
from ddptui.run.script.run import ScriptRun
from tests.helpers.runlogs import gpu_run, typed
from tests.helpers.runs import ROOT, TINY, assert_gone, events, run_config
from tests.helpers.screens import cells, fixed_hash, settle, until

DATA = os.path.join(ROOT, "tests", "data")
RECORDED = os.path.join(DATA, "run-2cpu.jsonl")


async def test_replay_fills_every_panel_and_offers_only_harmless_keys():
    app = DashboardApp(Replay(RECORDED, speed=0))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        ranks = cells(app.query_one(RankTable))
        assert [row[0] for row in ranks] == ["0", "1"]
        assert all(row[1] == "done" for row in ranks)
        epochs = cells(app.query_one(EpochTable))
        assert [row[0] for row in epochs] == ["0", "1", "2"]
        assert float(epochs[-1][6]) < float(epochs[0][6])  # the loss fell
        # A replay has nothing to steer: the control keys are neither shown nor active.
        assert app.check_action("pause", ()) is False
        assert app.check_action("toggle", ("prefetch",)) is False
        await pilot.press("down")
        assert app.selected_rank == 1 and app.query_one(RankTable).cursor_row == 1
        await pilot.press("down", "up")
        assert app.selected_rank == 0
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


class _Gate:
    """Events handed to a Replay, held back at index `at` until `go` is set."""

    def __init__(self, evs: list[dict], at: int):
        self.evs, self.at = evs, at
        self.reached, self.go = threading.Event(), threading.Event()

    def __iter__(self):
        for i, ev in enumerate(self.evs):
            if i == self.at:
                self.reached.set()
                self.go.wait(30)
            yield ev


async def test_the_rank_table_shows_the_last_step_once_the_log_is_played_out():
    """The tables are redrawn at most every 0.5 s of run time: a draw a quarter of a second
    before the log's end must not stay on screen (an SVG snapshot once caught it)."""
    evs = gpu_run(ranks=2, seconds=20)
    last_step = max(i for i, ev in enumerate(evs) if ev["kind"] == "step" and ev["rank"] == 0)
    gate = _Gate(evs, last_step)
    app = DashboardApp(Replay("gated", speed=0, events=gate))
    async with app.run_test(size=(120, 40)) as pilot:
        while not gate.reached.is_set():
            await pilot.pause(0.05)
        app.refresh_view()
        before = cells(app.query_one(RankTable))[0][2]
        gate.go.set()
        while not app.source.done.is_set():
            await pilot.pause(0.05)
        app.refresh_view()
        final = evs[last_step]
        assert before != f"{final['epoch']}/{final['step']}"
        assert cells(app.query_one(RankTable))[0][2] == f"{final['epoch']}/{final['step']}"


class _HeldEnd(_Gate):
    """Every event handed over, then the end of the log held back until `go` is set."""

    def __iter__(self):
        yield from self.evs
        self.reached.set()
        self.go.wait(30)


async def test_the_tables_are_measured_again_when_the_log_ends_after_its_last_draw():
    """The final draw (the source done) sizes the rank table's columns for its figures at once,
    even when the last events were drawn before the source said it was done: a snapshot under
    `make test` caught '1.84' for '1.8435'."""
    evs = gpu_run(ranks=2, seconds=20)
    gate = _HeldEnd(evs, 0)
    app = DashboardApp(Replay("held", speed=0, events=gate))
    async with app.run_test(size=(160, 40)) as pilot:
        while not gate.reached.is_set():
            await pilot.pause(0.05)
        app.refresh_view()  # every event drawn, the source not done yet
        await pilot.pause(0.3)
        gate.go.set()
        while not app.source.done.is_set():
            await pilot.pause(0.05)
        app.refresh_view()
        # At once, not when the app is next idle: a loaded machine may take a screenshot first.
        table = app.query_one(RankTable)
        loss = table.columns[next(k for k, c in table.columns.items() if str(c.label) == "loss")]
        shown = loss.get_render_width(table) - 2 * table.cell_padding
        assert shown >= max(len(row[3]) for row in cells(table)) > len("loss")


@fixed_hash
@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
def test_main_screen_snapshot(snap_compare, size):
    assert snap_compare(DashboardApp(Replay(RECORDED, speed=0)), terminal_size=size,
                        run_before=settle)


def _flood(ranks: int = 8, rate: float = 20.0, seconds: float = 6.0) -> list[dict]:
    """A run of `ranks` ranks each sending `rate` events a second."""
    t0 = 1_000_000.0
    evs = [{"t": t0, "kind": "run", "rank": -1, "status": "started", "model": "resnet50",
            "data": "synthetic", "epochs": 1, "world_size": ranks, "device_kind": "cuda"}]
    evs += [{"t": t0, "kind": "rank", "rank": r, "state": "running", "pid": 100 + r,
             "device": "cuda:0", "gpu": r} for r in range(ranks)]
    n = int(rate * seconds)
    for i in range(n):
        t = t0 + i / rate
        for r in range(ranks):
            if i % 2:
                evs.append({"t": t, "kind": "step", "rank": r, "epoch": 0, "step": i,
                            "global_step": i, "loss": 2.0 - i / n, "samples_per_s": 1000.0,
                            "step_ms": 250.0, "data_wait": 0.1})
            else:
                evs.append({"t": t, "kind": "gpu", "rank": r, "gpu": r, "util": 90,
                            "mem_used": 1000, "mem_total": 80000, "power_w": 500.0,
                            "temp_c": 60})
    return evs


async def test_keys_are_served_while_8_ranks_send_20_events_per_second():
    """Order and outcome only (how fast is bench/ territory): each key moves the selection while
    the flood is still coming, and the app quits on q in the middle of it."""
    app = DashboardApp(Replay("flood", speed=1.0, events=_flood(seconds=600.0)), refresh_s=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.query_one(RankTable).row_count == 8, "8 rank rows")
        for expected in (1, 2, 3):
            await pilot.press("down")
            await until(pilot, lambda e=expected: app.query_one(RankTable).cursor_row == e,
                         f"row {expected} selected")
        assert not app.source.done.is_set()  # served while the flood was still coming
        await pilot.press("q")
    assert app.return_code == 0



async def test_live_run_pause_settings_and_quit_ends_every_process(tmp_path):
    config = run_config(*TINY, "--epochs", "200")
    sup = Supervisor(config, str(tmp_path / "live.jsonl"))
    app = DashboardApp(sup)
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 60
        # The first steps come before their loss (read with a lag) and before the table redraws
        shown = lambda: all(row[3] != "-" and row[4] != "-"  # noqa: E731  loss and img/s
                            for row in cells(app.query_one(RankTable)))
        while not (app.view and all(r.state == "running" and r.step for r in app.view.ranks)
                   and len(app.view.ranks) == 2 and shown()):
            assert time.monotonic() < deadline, "ranks never showed live figures"
            await pilot.pause(0.2)
        rows = cells(app.query_one(RankTable))
        assert len(rows) == 2 and all(row[3] != "-" and row[4] != "-" for row in rows)
        # Space three times, faster than the ranks answer: pause, resume, pause (each press
        # builds on the one before, not on the ranks' last word).
        await pilot.press("space", "space", "space")
        await until(pilot, lambda: [e["status"] for e in events(tmp_path / "live.jsonl", "run")
                                     if e["rank"] == 0] == ["paused", "resumed", "paused"],
                     "paused, resumed, paused")
        await until(pilot, lambda: app.view.paused, "pause")
        await pilot.press("space")
        await until(pilot, lambda: not app.view.paused, "resume")
        await pilot.press("W")
        await until(pilot, lambda: any("settings requested: workers 1" in line.text
                                        for line in app.events.lines), "request in the events")
        await until(pilot, lambda: any(row[2] == "1" for row in cells(app.epoch_table)),
                     "an epoch with 1 worker", timeout=60)
        pids = sup.pids()
        await pilot.press("q")
        await until(pilot, lambda: sup.done.is_set(), "quit", timeout=60)
    assert sup.exit_code == 130
    assert_gone(pids)


async def test_keys_stop_and_restart_a_rank_and_apply_settings_now(tmp_path):
    # TINY on 128-step epochs in a world of 2 (the later --data wins): `a` below has room to
    # land inside one.
    sup = Supervisor(run_config(*TINY, "--data", "tests.helpers.userpkg:many_blobs", "--epochs", "500"),
                     str(tmp_path / "live.jsonl"))
    app = DashboardApp(sup)

    def state(rank: int) -> str:
        return next(r.state for r in app.view.ranks if r.rank == rank)

    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.view and app.view.status == "running"
                     and len(app.view.ranks) == 2, "a running world of 2", timeout=60)
        await pilot.press("down", "s")
        await until(pilot, lambda: app.view.meta["world_size"] == 1, "the world of 1")
        # Rank 1's own "stopped" may arrive a moment after the supervisor's world event.
        await until(pilot, lambda: cells(app.rank_table)[1][1].startswith("stopped"),
                     "rank 1 shown stopped", timeout=30)
        await pilot.press("s")  # rank 1 is out already: nothing to stop
        await pilot.press("r")  # at once, while its standby still warms: queued, not refused
        await until(pilot, lambda: app.view.meta["world_size"] == 2 and state(1) == "running",
                     "rank 1 back in a world of 2", timeout=90)
        await pilot.press("a")  # nothing pending yet: refused, nothing sent
        # Paused first: an epoch ending between the request and `a` would take the new
        # setting at its boundary, and `a` would find nothing pending.
        # Space three times, faster than the ranks answer: pause, resume, pause (each press
        # builds on the one before, not on the ranks' last word).
        await pilot.press("space", "space", "space")
        await until(pilot, lambda: [e["status"] for e in events(tmp_path / "live.jsonl", "run")
                                     if e["rank"] == 0] == ["paused", "resumed", "paused"],
                     "paused, resumed, paused")
        await until(pilot, lambda: app.view.paused, "pause")
        # Each key builds on the one before, though no view is drawn between them: 1, 2, 1.
        await pilot.press("W", "W", "w", "a")
        await until(pilot, lambda: app.view.settings["workers"] == 1, "workers 1 applied")
        applied = next(e for e in events(tmp_path / "live.jsonl", "settings")
                       if e["status"] == "applied" and e["settings"]["workers"] == 1)
        await pilot.press("space")
        epoch, step = applied["epoch"], applied["step"]
        # The epoch's row splits at the paused step: before it 0 workers, after it 1. (Paused
        # on an epoch's last step, 1 in 128, the change lands at the boundary instead.)
        before = rf"^{epoch - 1}( |$)" if step == 0 else rf"^{epoch} ·\d+-{step}$"
        after = rf"^{epoch}( |$)" if step == 0 else rf"^{epoch} ·{step}-"
        await until(pilot, lambda: any(re.match(after, row[0]) and row[2] == "1"
                                        for row in cells(app.epoch_table)),
                     f"epoch {epoch} from step {step} with 1 worker")
        assert any(re.match(before, row[0]) and row[2] == "0" for row in cells(app.epoch_table))
        pids = sup.pids()
        await pilot.press("q")
        await until(pilot, lambda: sup.done.is_set(), "quit", timeout=60)
    assert sup.exit_code == 130
    lines = [line.text for line in app.events.lines]
    assert any("world: 1 rank [0]" in t for t in lines)
    assert any("world: 2 ranks [0, 1]" in t for t in lines)
    # From the stop to the join, the log never shows rank 1 as anything but stopped.
    states = [(e["state"], e.get("standby")) for e in events(tmp_path / "live.jsonl", "rank")
              if e["rank"] == 1]
    out = states[states.index(("stopped", None)):]
    out = out[:out.index(("restarting", None))]
    assert {state for state, _ in out} == {"stopped"}
    assert ("stopped", "warming") in out and ("stopped", "ready") in out
    assert_gone(pids)


async def test_two_nodes_gpus_and_growing_figures_are_shown_whole():
    """Under attach two nodes each report GPU 0 and 1; labels, power and a throughput that
    grows from "-" to five digits must not be cut; after the run the readings say "last"."""
    t = 1795391977.0
    events = [{"t": t, "kind": "run", "rank": -1, "status": "started", "model": "resnet18",
               "data": "synthetic", "epochs": 1, "world_size": 4, "device_kind": "cuda"}]
    steps = []
    for rank in range(4):
        node, gpu = f"node-{'ab'[rank // 2]}/{rank // 2}", rank % 2
        events += [
            {"t": t + 1, "kind": "rank", "rank": rank, "state": "running", "pid": 100 + rank,
             "device": "cuda:0", "gpu": gpu, "host": node, "node": node},
            {"t": t + 2, "kind": "gpu", "rank": rank, "gpu": gpu, "node": node, "util": 97.0,
             "mem_used": 6000, "mem_total": 143771, "power_w": 654.0 + rank, "temp_c": 55.0},
        ]
        steps.append({"t": t + 3, "kind": "step", "rank": rank, "epoch": 0, "step": 9,
                      "global_step": 9, "loss": 0.0008, "samples_per_s": 12937.0 + rank,
                      "step_ms": 19.8, "data_wait": 0.0})
    app = DashboardApp(Replay("two-nodes.jsonl", speed=0, events=events))
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot)  # the rows are drawn before any step ("-")
        for ev in steps:
            app.source.state.apply(typed(ev))
        app.refresh_view()
        await pilot.pause()
        svg = app.export_screenshot().replace("&#160;", " ")
        # Once the run is over the last readings are not shown as the present.
        app.source.state.apply(typed({"t": t + 4, "kind": "run", "rank": -1, "status": "done",
                                "exit_code": 0}))
        app.refresh_view()
        await pilot.pause()
        done_svg = app.export_screenshot().replace("&#160;", " ")
    assert " 97% last" not in svg and done_svg.count(" 97% last") == 4
    for node in ("node-a/0", "node-b/1"):
        for gpu in (0, 1):
            assert f"{node} GPU {gpu}" in svg
    assert "654W 55C" in svg and "657W 55C" in svg
    assert "12,937" in svg and "12,940" in svg and "0.0008" in svg


@pytest.mark.parametrize("cls", [Supervisor, ScriptRun, Attach, Replay, Viewer])
def test_every_run_source_serves_the_keys_its_flags_offer(cls):
    """The app asks a source's flags, then calls: a flag that offers a key the source does not
    serve would end in NotImplementedError on a key press."""
    def serves(name: str) -> bool:
        return getattr(cls, name) is not getattr(RunSource, name)

    steering = ("pause", "resume", "checkpoint", "change_settings", "apply_now")
    assert all(map(serves, steering)) if cls.can_steer else not any(map(serves, steering))
    if cls.can_steer:  # rank by rank (attach too: through a rank's wrapper, or it says why not)
        assert serves("stop_rank") and serves("restart_rank")
        assert serves("kill_rank") and serves("stacks")
    # A script's run restarts as a group (capabilities: restarts_as_group): the run that owns
    # its ranks, and the dashboards of that run's process.
    assert serves("restart_group") == (cls in (ScriptRun, Viewer))
