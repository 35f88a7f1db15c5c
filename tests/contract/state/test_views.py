"""A view copies anew only the rows events touched since the last one: what each view shows is
still every rank's and device's latest, whatever event changed it (a start that resets every
row, one rank's stacks sent by another, a rank found on another node)."""

from __future__ import annotations

from ddptui.contract.protocol import events as ev
from ddptui.contract.protocol.events import PARENT
from ddptui.contract.state.runstate import RunState


def _state(ranks: int = 3) -> RunState:
    state = RunState(live=False)
    state.apply(ev.Run(rank=PARENT, status="started", t=100.0))
    for r in range(ranks):
        state.apply(ev.Rank(rank=r, state="running", pid=10 + r, node=f"n{r % 2}",
                            control=["pause"], t=100.0))
    return state


def test_a_step_shows_in_the_next_view_and_the_other_rows_are_as_they_were():
    state = _state()
    before = state.view()
    state.apply(ev.Step(rank=1, epoch=0, step=5, global_step=5, loss=0.5, t=101.0))
    after = state.view()
    rows = {r.rank: r for r in after.ranks}
    assert (rows[1].step, rows[1].loss) == (5, 0.5)
    assert [r.step for r in before.ranks] == [0, 0, 0]  # an earlier view is not changed
    assert [(r.rank, r.step) for r in after.ranks if r.rank != 1] == [(0, 0), (2, 0)]


def test_a_restart_clears_every_rows_control_and_a_runs_end_every_standby():
    state = _state()
    state.apply(ev.Rank(rank=2, state="stopped", standby="ready", t=101.0))
    assert [r.control for r in state.view().ranks] == [["pause"]] * 3
    state.apply(ev.Run(rank=PARENT, status="started", restart=1, t=102.0))
    assert [r.control for r in state.view().ranks] == [[], [], []]
    assert {r.rank: r.standby for r in state.view().ranks}[2] == "ready"
    state.apply(ev.Run(rank=PARENT, status="done", exit_code=0, t=103.0))
    assert [r.standby for r in state.view().ranks] == ["", "", ""]


def test_stacks_sent_for_another_rank_show_on_that_ranks_row():
    state = _state()
    state.view()
    state.apply(ev.Stacks(rank=PARENT, stacks_of=2, stacks="Thread 0x1: train.py:12",
                          level="info", text="stacks of rank 2", t=101.0))
    assert {r.rank: r.stacks for r in state.view().ranks}[2] == "Thread 0x1: train.py:12"


def test_rows_go_node_by_node_and_move_when_a_rank_says_its_node():
    state = _state(4)
    assert [(r.node, r.rank) for r in state.view().ranks] == \
        [("n0", 0), ("n0", 2), ("n1", 1), ("n1", 3)]
    state.apply(ev.Rank(rank=0, state="running", node="n2", t=101.0))
    assert [r.rank for r in state.view().ranks] == [2, 1, 3, 0]


def test_a_devices_reading_shows_and_ages_in_each_view():
    state = _state()
    state.apply(ev.Gpu(rank=0, gpu=0, node="n0", util=40.0, t=100.0))
    state.apply(ev.Gpu(rank=1, gpu=0, node="n1", util=50.0, t=100.0))
    state.view()
    state.apply(ev.Gpu(rank=0, gpu=0, node="n0", util=90.0, t=110.0))
    view = state.view()
    assert [(d.key, d.util, d.stale) for d in view.devices] == \
        [("n0 gpu0", 90.0, False), ("n1 gpu0", 50.0, True)]  # 10 s without a reading
    assert [len(d.history) for d in view.devices] == [2, 1]
