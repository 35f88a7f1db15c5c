"""e: where each rank's step time goes, drawn from a made-up 8-GPU run whose rank 5 is held
down by its GPU's power cap: the straggler and its phase and cause, the others waiting for it in
all-reduce, memory that grows, and the run's verdict once it has ended."""

from __future__ import annotations

from textual.widgets import Static

from ddptui.dashboard.sources.replay import Replay
from ddptui.dashboard.view.app import DashboardApp
from ddptui.dashboard.view.screens.steptime_screen import StepTimeScreen
from tests.helpers.runlogs import phased_run
from tests.helpers.screens import fixed_hash, settle


def _app(finished: bool = False) -> DashboardApp:
    return DashboardApp(Replay("phased", speed=0, events=phased_run(finished=finished)))


async def _open(pilot) -> None:
    await settle(pilot)
    await pilot.press("e")
    await pilot.pause(0.3)
    pilot.app.screen.redraw()  # at the sizes laid out by now (its first drawing guessed them)
    await pilot.pause(0.3)


def _text(app, widget: str) -> str:
    return str(app.screen.query_one(widget, Static).render())


async def test_e_names_the_straggler_its_phase_and_its_gpus_cap_and_who_waits():
    app = _app()
    async with app.run_test(size=(160, 50)) as pilot:
        await _open(pilot)
        assert isinstance(app.screen, StepTimeScreen)
        verdict = _text(app, "#steptime-verdict").splitlines()
        assert verdict[0].startswith("rank 5: 17% slower than the median; its backward +30%: "
                                     "GPU 5 held at 1,980 MHz by power cap"), verdict
        assert "rank 0 waits 17% of its step in all-reduce: for rank 5" not in verdict  # < 20%
        assert any(line.startswith("rank 3: memory peak +300 MiB an epoch: out of memory in "
                                   "about") for line in verdict), verdict
        ranks = _text(app, "#steptime-ranks").splitlines()
        assert len(ranks) == 8 and ranks[5].startswith("> rank 5"), ranks
        assert "GPU 30,500 of 143,771 MiB, peak 32,500 " in ranks[3], ranks[3]
        await pilot.press("escape")
        assert not isinstance(app.screen, StepTimeScreen)


async def test_a_finished_runs_screen_shows_its_verdict():
    app = _app(finished=True)
    async with app.run_test(size=(160, 50)) as pilot:
        await _open(pilot)
        verdict = _text(app, "#steptime-verdict").splitlines()
        assert verdict[0].startswith("verdict: resnet50 done after"), verdict
        assert any(line.startswith("  slowest: rank 5:") for line in verdict), verdict


@fixed_hash
def test_steptime_screen_snapshot(snap_compare):
    assert snap_compare(_app(), terminal_size=(160, 50), run_before=_open)
