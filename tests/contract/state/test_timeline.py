"""A run's loss lines stay bounded: 1,024 points a rank in a job of a few ranks; past 16 ranks,
where the chart draws their band, the band alone (1,024 points of three lines)."""

from __future__ import annotations

import pytest

from ddptui.contract.protocol import events as ev
from ddptui.contract.state.runstate import RunState


def _stepped(ranks: int, steps: int, spread: float = 0.0) -> RunState:
    state = RunState()
    for r in range(ranks):
        state.apply(ev.Rank(rank=r, state="running", pid=100 + r))
    for s in range(steps):
        for r in reversed(range(ranks)):  # rank 0, whose steps make the points, last
            state.apply(ev.Step(rank=r, epoch=0, step=s, global_step=s, loss=(1 + spread * r) / (1 + s),
                                t=1000.0 + s))
    return state


def test_a_few_ranks_keep_their_loss_in_full_resolution_up_to_1024_points():
    state = _stepped(2, 1000)
    assert [len(line.points) for line in state.loss_lines.values()] == [1000, 1000]


def test_past_16_ranks_the_chart_gets_their_loss_band_over_the_whole_run_not_a_line_a_rank():
    state = _stepped(17, 3000, spread=0.01)
    assert not state.loss_lines  # 17 lines of the whole run were the charts' cost and memory
    charts = state.charts()
    assert charts["loss"] == {} and charts["ranks"] == 17
    low, mid, high = (charts["band"][name] for name in ("min", "median", "max"))
    assert 1024 // 2 <= len(low) == len(mid) == len(high) < 1024
    assert low[0][0] < 30 and low[-1][0] > 2900  # the whole run, in seconds since its start
    first, last = low[0][1], high[-1][1]
    assert low[0][1] < mid[0][1] < high[0][1]  # rank 0's, rank 8's, rank 16's loss
    assert high[0][1] / low[0][1] == pytest.approx(1.16) and mid[0][1] / low[0][1] == \
        pytest.approx(1.08)
    assert all(a[1] >= b[1] for a, b in zip(low, low[1:], strict=False)) and last < first
