"""The dashboard drawn to the end, for snapshots and screen checks: a replay played out and
its charts built; snapshots only under a fixed hash seed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time

import pytest

from ddptui.dashboard.view.widgets.charts import Chart

# plotext chooses tick labels and colours in str-hash order: a chart's snapshot is the same
# from run to run only with a fixed hash seed (make test sets PYTHONHASHSEED=0).
fixed_hash = pytest.mark.skipif(bool(sys.flags.hash_randomization),
                                reason="needs PYTHONHASHSEED=0 (make test sets it)")


async def settle(pilot) -> None:
    """Play a replayed log to its end, then draw its final state, charts included, with the
    panels' heights and the events pane's scroll settled (snapshots are taken after this)."""
    app = pilot.app
    while not app.source.done.is_set():
        await pilot.pause(0.05)
    for _ in range(2):  # rows added change the panels' heights, and so the charts' size
        app.refresh_view()
        await pilot.pause(0.2)
    app.refresh_charts()
    app.events.scroll_end(animate=False)
    # The charts are built on threads and shown once built; a chart resized meanwhile builds
    # again. On a loaded machine that takes more than one pause.
    for _ in range(50):
        await app.workers.wait_for_complete()
        await pilot.pause(0.1)
        if all(chart.drawn for chart in app.query(Chart) if chart.display):
            break
    await pilot.wait_for_scheduled_animations()
    # A loaded machine may still be laying out (a table measures its columns when the app is
    # idle: a snapshot under `make test`'s three at a time caught the rank table mid-way): the
    # screen counts as drawn once two screenshots 0.2 s apart are the same.
    shot = None
    for _ in range(25):
        await pilot.pause(0.2)
        shot, last = app.export_screenshot(), shot
        if shot == last:
            break


def tmux(*args: str, check: bool = True) -> str:
    """tmux on a server of the session's own, named after it (every call names its session, with
    -s or -t): a server shared by the tests of one xdist worker exited as one test killed its
    last session, under the next test's new session ("server exited unexpectedly")."""
    session = args[next(i for i, a in enumerate(args) if a in ("-s", "-t")) + 1]
    return subprocess.run(["tmux", "-L", session, *args],
                          capture_output=True, text=True, check=check).stdout


def end_tmux(session: str) -> None:
    """The session's server ended, and its socket file removed: tmux leaves the file behind when
    its server exits, one per test session in /tmp otherwise."""
    subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True)
    socket = os.path.join(os.environ.get("TMUX_TMPDIR", "/tmp"), f"tmux-{os.getuid()}", session)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket)


def rank_row(app, rank: int) -> dict:
    """The ranks table's row of `rank`, by column label, as the screen shows it."""
    from ddptui.dashboard.view.widgets.tables import RankTable

    table = app.query_one(RankTable)
    if rank >= table.row_count:
        return {}
    return {str(c.label): str(v) for c, v in zip(table.ordered_columns,
                                                  table.get_row_at(rank), strict=True)}


def cells(table) -> list[list[str]]:
    """A DataTable's rows as the screen shows them."""
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def until(pilot, predicate, what: str, timeout: float = 90) -> None:
    """Wait for an outcome; the timeout only keeps a hang from eating the suite. A failure says
    what the screen showed: its epochs table and last event lines."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout} s\n{_screen(pilot.app)}"
        await pilot.pause(0.1)
    await asyncio.sleep(0)


def _screen(app) -> str:
    rows = "\n".join(" | ".join(row) for row in cells(app.epoch_table))
    lines = "\n".join(line.text for line in list(app.events.lines)[-20:])
    return f"epochs:\n{rows}\nevents:\n{lines}"
