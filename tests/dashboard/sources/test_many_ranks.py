"""64 ranks on 8 nodes under a real attach (each its own connection, as wrapped ranks speak):
the ranks table folds them into a row a node, pins the stalled rank on top, and `/` finds a
rank by its number."""

from __future__ import annotations

import threading
import time

import pytest

from ddptui.contract.channel import connect, send
from ddptui.contract.protocol import events as ev
from ddptui.contract.state.heat import heat
from ddptui.dashboard.sources.attach import Attach
from ddptui.dashboard.view.screens.heat_screen import HeatScreen
from tests.helpers.runs import REPORT_KEY, local_port

RANKS, PER_NODE, STALLED = 64, 8, 35


class Job:
    """The ranks: each says its clock and who it is, then steps (and its process figures)
    until stop(); rank STALLED stops stepping and idles after its first steps."""

    def __init__(self, address, ranks=range(RANKS), again: bool = False):
        """`again`: the ranks' links connecting to an attach restarted (a clock, then on)."""
        self.conns = {r: connect(address, REPORT_KEY.encode()) for r in ranks}
        self.halt = threading.Event()
        for r, conn in self.conns.items():
            node = f"n{r // PER_NODE}"
            for e in (ev.Clock(rank=r), ev.Rank(rank=r, state="running", pid=5000 + r,
                                                api="ddptui.rank.wrap", local_rank=r % PER_NODE,
                                                host=node),
                      ev.Gpu(rank=r, gpu=r % PER_NODE, util=50.0 if r == STALLED else 100.0,
                             mem_used=1000, mem_total=80000))[:1 if again else 3]:
                send(conn, e.replace(node=node))
        if not again:
            send(self.conns[0], ev.Run(rank=0, status="started", model="train.py", data="",
                                       epochs=0, world_size=RANKS, device_kind="cpu",
                                       script="train.py", node="n0"))
        self.tick = 10 if again else 0  # (rank STALLED idles from its third tick)
        self.thread = threading.Thread(target=self._play, daemon=True)
        self.thread.start()

    def _play(self) -> None:
        tick = self.tick
        while not self.halt.wait(0.2):
            tick += 1
            for r, conn in list(self.conns.items()):
                node = f"n{r // PER_NODE}"
                idle = r == STALLED and tick > 2
                if not idle:
                    send(conn, ev.Step(rank=r, epoch=0, step=tick, global_step=tick, loss=1.0,
                                       samples_per_s=900.0 if r // PER_NODE == 1 else 1000.0,
                                       step_ms=200.0, node=node))
                if tick % 5 == 1:
                    send(conn, ev.Process(rank=r, pid=5000 + r, rss=100, node=node,
                                          status="sleeping" if idle else "running",
                                          cpu_percent=0.0 if idle else 100.0,
                                          opt_steps=2 if idle else tick,
                                          moves=2 if idle else tick))

    def stop(self) -> None:
        self.halt.set()
        self.thread.join()
        for conn in self.conns.values():
            conn.close()

    def orphaned(self) -> None:
        """Their attach went away: the links stop sending (a rank's link tries again later)."""
        self.halt.set()
        self.thread.join()


def _keys(app) -> list[str]:
    return [row.key.value for row in app.rank_table.ordered_rows]


@pytest.mark.timeout(120)
async def test_sixty_four_ranks_fold_by_node_with_the_stalled_one_pinned(tmp_path):
    from ddptui.dashboard.view.app import DashboardApp

    attach = Attach(("127.0.0.1", local_port()), REPORT_KEY.encode(),
                    str(tmp_path / "a.jsonl"), "test", stall_after=2.0)
    app = DashboardApp(attach)
    rings: list[int] = []
    app.bell = lambda: rings.append(1)  # the terminal's bell, counted
    async with app.run_test(size=(160, 50)) as pilot:
        job = Job(attach.address)
        try:
            deadline = time.monotonic() + 60
            while not (app.view and len(app.view.ranks) == RANKS and
                       _keys(app)[:1] == [str(STALLED)]):
                assert time.monotonic() < deadline, f"rows never settled: {_keys(app)[:12]}"
                await pilot.pause(0.2)
            # The stalled rank first, then a row a node; rank 0's node open, the others closed.
            assert _keys(app) == [str(STALLED), "node:n0", *map(str, range(8)),
                                  *(f"node:n{n}" for n in range(1, 8))]
            row = app.rank_table.get_row("node:n4")
            assert row[0] == "▸ n4" and str(row[1]) == "stalled 1/8"  # its worst, pinned above too
            assert app.rank_table.get_cell("node:n1", "samples/s") == "900/900/900"  # slow node
            await pilot.pause(2.5)  # the heat map's last rows after the stall
            await pilot.press("h")  # the heat map: rank 35's column dark from its stall
            await pilot.pause(0.3)
            assert isinstance(app.screen, HeatScreen)
            picture = heat(app.source.state, RANKS, 8)
            assert picture.per_column == 1 and picture.cells[-2][STALLED] is None
            assert all(v is not None for i, v in enumerate(picture.cells[-2]) if i != STALLED)
            await pilot.press("escape")
            gpus = app.devices.render().plain.splitlines()  # a line a node, a cell a GPU
            assert len(gpus) == 8 and gpus[0].startswith("n0 ")
            assert gpus[4].startswith("n4 " + "█" * 3 + "▄" + "█" * 4)  # rank 35's GPU
            await pilot.press("slash", "4", "2", "enter")
            await pilot.pause(0.3)
            assert app.selected_rank == 42
            keys = _keys(app)
            assert keys[keys.index("node:n5") + 1:][:8] == [str(r) for r in range(40, 48)]
            assert keys[app.rank_table.cursor_row] == "42"
            await pilot.press("slash", "9", "9", "enter")  # not a rank: said, nothing moves
            await pilot.press("escape")
            assert app.selected_rank == 42
            await pilot.press(*["down"] * 6)  # past the node's last rank: the next node opens
            await pilot.pause(0.3)
            assert app.selected_rank == 48 and "node:n4" in _keys(app)
            assert rings == [1]  # once for the stall, however often the screen was drawn
            assert _keys(app)[_keys(app).index("node:n6") + 1] == "48"
        finally:
            job.stop()
        await pilot.press("q")
        await pilot.pause()
    assert attach.done.is_set()


@pytest.mark.timeout(120)
async def test_an_attach_restarted_on_its_log_draws_the_job_at_once_then_hears_its_ranks(tmp_path):
    """The first attach keeps the job's state beside its log; the next one on that log shows the
    64 ranks, node rows and the stalled rank pinned before any rank reports again; ranks that
    report are live again, and a node that never does is unreachable."""
    from ddptui.dashboard.view.app import DashboardApp

    log = str(tmp_path / "a.jsonl")
    first = Attach(("127.0.0.1", local_port()), REPORT_KEY.encode(), log, "test", stall_after=2.0)
    first.start()
    job = Job(first.address)
    deadline = time.monotonic() + 60
    while not (len(first.state.ranks) == RANKS
               and first.state.ranks[STALLED].state == "stalled"):
        assert time.monotonic() < deadline, "the first attach never saw the stall"
        time.sleep(0.2)
    first.stop()  # its state is kept beside the log at its end (and every few seconds)
    job.orphaned()
    assert first.state.ranks[STALLED].state == "stalled"
    lines_before = open(log).read().count("\n")

    attach = Attach(("127.0.0.1", local_port()), REPORT_KEY.encode(), log, "test",
                    stall_after=2.0)
    app = DashboardApp(attach)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause(0.3)  # no rank has reported to this attach yet
        assert len(app.view.ranks) == RANKS
        assert _keys(app)[:2] == [str(STALLED), "node:n0"]
        assert str(app.rank_table.get_row("node:n4")[1]) == "stalled 1/8"
        said = [line[3] for line in attach.state.lines]
        assert f"continuing {log}" in said[-1] and "(64 ranks)" in said[-1]
        again = Job(attach.address, ranks=range(RANKS - PER_NODE), again=True)  # node 7 is gone
        try:
            deadline = time.monotonic() + 60
            while not all(app.view.ranks[r].state.value == "unreachable"
                          for r in range(RANKS - PER_NODE, RANKS)):
                assert time.monotonic() < deadline, "node n7 was never unreachable"
                await pilot.pause(0.2)
            await pilot.pause(1.0)
            states = {r: app.view.ranks[r].state.value for r in range(RANKS - PER_NODE)}
            assert states.pop(STALLED) == "stalled"  # still idle: its flag stands
            assert set(states.values()) == {"running"}
            assert app.view.ranks[1].global_step > first.state.ranks[1].global_step
            said = [line[3] for line in attach.state.lines]
            assert not any("making progress again" in s or "reporting again" in s for s in said)
        finally:
            again.stop()
        await pilot.press("q")
        await pilot.pause()
    with open(log) as f:  # the log goes on after the first attach's lines, whole
        assert f.read().count("\n") > lines_before
