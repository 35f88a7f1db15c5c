"""The heat map's figures: a slow rank stands out against each second's median, a hung one is
dark from where it stopped, and a script's steps with no time known are steps, not a hang."""

from __future__ import annotations

from ddptui.contract.protocol.events import Run, Step
from ddptui.contract.state.heat import heat
from ddptui.contract.state.runstate import RunState


def _job(step_ms: dict[int, float], stop: dict[int, float], seconds: int = 20) -> RunState:
    state = RunState(live=False)
    state.apply(Run(t=0.0, rank=-1, status="started", model="m", world_size=len(step_ms)))
    for i in range(seconds * 4):
        t = i / 4
        for rank, ms in step_ms.items():
            if t < stop.get(rank, seconds):
                state.apply(Step(t=t, rank=rank, epoch=0, step=i, global_step=i, loss=1.0,
                                 step_ms=ms or None, samples_per_s=100.0 if ms else None))
    return state


def test_a_slow_rank_is_a_stripe_and_a_hung_one_a_dark_column():
    h = heat(_job({0: 100.0, 1: 100.0, 2: 140.0, 3: 100.0}, {3: 10.0}), columns=80, rows=8)
    assert h.per_column == 1 and h.row_s == 1.0
    last = h.cells[-2]  # a whole second, all of it after rank 3 stopped
    assert last[0] == last[1] == 1.0 and last[2] == 1.4 and last[3] is None


def test_many_ranks_share_a_column_by_their_slowest():
    h = heat(_job({r: 150.0 if r == 5 else 100.0 for r in range(16)}, {}), columns=4, rows=4)
    assert h.per_column == 4 and len(h.cells[-2]) == 4
    assert h.cells[-2][1] == 1.5 and h.cells[-2][0] == 1.0


def test_steps_read_from_output_are_steps_not_a_hang():
    h = heat(_job({0: 0.0, 1: 0.0}, {}), columns=10, rows=4)
    assert h.cells[-2] == [1.0, 1.0]
