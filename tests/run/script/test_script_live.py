"""A script's run driven as a user drives it: the dashboard over real rank processes (Pilot key
presses), and the three lines of ddptui.init() taking pause, checkpoint and stop at one step."""

from __future__ import annotations

import asyncio
import os

import pytest

from ddptui.dashboard.view.app import DashboardApp
from ddptui.dashboard.view.screens.confirm import ConfirmRestart
from tests.helpers.runs import (
    ROOT,
    assert_gone,
    assert_stops_cleanly,
    epoch_samples,
    events,
    rank_pids,
    wait_for_event,
)
from tests.helpers.screens import rank_row
from tests.helpers.scriptruns import script_run, until_shown

LOOPING = os.path.join(ROOT, "tests", "helpers", "scripts", "looping.py")
WITH_DDPTUI = os.path.join(ROOT, "examples", "with_ddptui.py")


def _float(text: str | None) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):  # not shown yet
        return 0.0




def _toasts(app) -> list[str]:
    """The notifications on screen, as the user reads them."""
    return [str(t.render()) for t in app.screen.query("Toast")]


@pytest.mark.timeout(300)
async def test_the_dashboard_shows_a_scripts_ranks_and_restarts_them_together(script_env,
                                                                               tmp_path):
    log = tmp_path / "dash.jsonl"
    run = script_run([LOOPING, "--cpus", "2", "--grace", "3"], log)
    app = DashboardApp(run)
    async with app.run_test(size=(160, 45), notifications=True) as pilot:
        await until_shown(pilot, lambda: "loss:" in rank_row(app, 1).get("output", ""))
        row = rank_row(app, 1)
        assert row["state"] == "running" and row["process"] in ("running", "sleeping")
        assert row["CPU"].endswith("%") and row["RSS"].endswith("M")
        # Loss lines become a step event at most every 50 ms, the mean of those read: the
        # progress bar's first `loss=0.000` can be the row's loss until the next one lands.
        await until_shown(pilot, lambda: _float(rank_row(app, 1).get("loss")) > 0)
        await pilot.press("space")  # no ddptui.init() in it: nothing to pause, and it says so
        assert run.state.vitals().pause_asked is None
        await pilot.pause(0.2)
        assert any("your script takes no pause from ddptui" in t for t in _toasts(app))
        assert app.check_action("pause", ()) is None  # dimmed in the footer
        await pilot.press("question_mark")  # the help says what each key does for this run
        help_text = app.screen.text
        assert "| space | *cannot act here:* your script takes no pause" in help_text
        assert "| s | restart every rank (asked first): your script has no run.elastic()" \
            in help_text
        await pilot.press("escape")
        await pilot.press("down", "s")
        assert isinstance(app.screen, ConfirmRestart)
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmRestart)
        first = rank_pids(log)
        await pilot.press("k")
        await pilot.press("y")
        await until_shown(pilot, lambda: any(e.get("restart") == 1 for e in events(log, "run")))
        # The new process's row (its pid), not the old one's last look.
        await until_shown(pilot, lambda: "loss:" in rank_row(app, 1).get("output", "") and
                     rank_row(app, 1)["state"] == "running" and
                     rank_row(app, 1)["pid"] not in {str(pid) for pid in first}, log=log)
        assert_gone(first)
        pids = rank_pids(log)
        await pilot.press("q")
        await until_shown(pilot, run.done.is_set, 30, log)
        await pilot.pause(0.3)
    assert run.exit_code == 130
    states = [(e["rank"], e["state"]) for e in events(log, "rank") if e.get("reason", "")
              .startswith("ended by ddptui")]
    assert sorted(states) == [(0, "stopped"), (0, "stopped"), (1, "stopped"), (1, "stopped")]
    assert_gone(pids)


@pytest.mark.timeout(300)
async def test_three_lines_take_pause_checkpoint_and_stop_at_one_step(script_env, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(ROOT, "examples"),
                                                      os.environ["PYTHONPATH"]]))
    log = tmp_path / "api.jsonl"
    run = script_run([WITH_DDPTUI, "--cpus", "2", "--grace", "20", "--", "--epochs", "1000",
                "--samples", "2048", "--image-size", "16", "--step-seconds", "0.02"], log)
    run.start()
    try:
        wait_for_event(log, lambda e: e["kind"] == "epoch" and e["rank"] == 1, 60)
        for rank in (0, 1):
            wait_for_event(log, lambda e, r=rank: e["kind"] == "step" and e["rank"] == r, 30)
        steps = events(log, "step")
        assert {e["rank"] for e in steps} == {0, 1}
        assert all(e.get("source") is None and e["samples_per_s"] > 0 for e in steps)
        assert "pause" in run.controls and run.capabilities.why_not("pause") is None
        # run.epochs(1000) gives the header its range: it said "epoch 39" with no total.
        assert run.state.view().progress.where.endswith(" of 0-999")
        epoch = events(log, "epoch")[0]
        assert epoch["samples"] == 1024 and "train_acc" in epoch["metrics"]
        assert 0 < epoch["data_wait"] < 1  # run.step's waits for run.loader(), over the epoch
        run.pause()
        paused = wait_for_event(log, lambda e: e.get("status") == "paused", 30)
        # run.loader(): w/W then a, agreed while paused: every rank switches at the paused step.
        assert run.capabilities.why_not("settings") is None
        run.change_settings(workers=1)
        wait_for_event(log, lambda e: e["kind"] == "settings" and e.get("status") == "pending"
                       and e["settings"]["workers"] == 1, 30)
        run.apply_now()
        run.checkpoint()  # taken while paused, at the step they paused at
        wait_for_event(log, lambda e: "checkpoint asked for" in e.get("text", ""), 30)
        run.resume()
        resumed = wait_for_event(log, lambda e: e.get("status") == "resumed", 30)
        assert resumed["global_step"] == paused["global_step"]
        assert any(name.startswith("epoch") for name in os.listdir(tmp_path)
                   if name.endswith(".pt"))
        applied = wait_for_event(log, lambda e: e["kind"] == "settings" and
                                 e.get("status") == "applied" and e["settings"]["workers"] == 1, 30)
        later = applied["epoch"] + 1
        wait_for_event(log, lambda e: e["kind"] == "epoch" and e["epoch"] == later, 60)
        rows = [e for e in events(log, "epoch") if e["epoch"] <= later]
        assert set(epoch_samples(log).values()) == {1024}  # each rank's share, no sample lost
        # The row of the epoch they paused in is cut there (unless that was the epoch's end).
        at = paused["global_step"] % epoch["steps"]
        assert applied["step"] == at
        for rank in (0, 1):
            cut = [(e["partial"], e["settings"]["workers"], e["start_step"], e["end_step"])
                   for e in rows if e["rank"] == rank and e["epoch"] == applied["epoch"]]
            assert cut == ([(True, 0, 0, at), (False, 1, at, epoch["steps"])] if at else
                           [(False, 1, 0, epoch["steps"])]), cut
        assert {e["settings"]["workers"] for e in rows if e["epoch"] == later} == {1}
    except BaseException:
        run.stop()
        run.stop()
        raise
    # q ends the loop at an agreed step: both ranks finish cleanly, nothing is killed.
    assert_stops_cleanly(run, log)
    await asyncio.sleep(0)


def test_ranks_without_a_process_group_each_take_pause_and_stop(script_env, tmp_path):
    """No group to agree through: every rank gets the order and acts on it at a step of its own,
    so q still ends every rank's loop cleanly (not rank 0's alone, the others signalled)."""
    log = tmp_path / "alone.jsonl"
    run = script_run([os.path.join(ROOT, "tests", "helpers", "scripts", "alone.py"), "--cpus", "2",
                "--grace", "20"], log)
    run.start()  # (a failure half-way: conftest ends the run)

    def each_rank(says, timeout: float = 30) -> None:
        for rank in (0, 1):
            wait_for_event(log, lambda e, r=rank: e["rank"] == r and says(e), timeout)

    each_rank(lambda e: e["kind"] == "rank" and e.get("alone"), 60)
    run.pause()
    each_rank(lambda e: e.get("status") == "paused")
    run.resume()
    each_rank(lambda e: e.get("status") == "resumed")
    assert_stops_cleanly(run, log)
