"""A run's loss lines stay bounded: 1,024 points a rank in a job of a few ranks, a chart's width
(256) a rank past 16 ranks, where the chart draws their envelope and attach keeps them all."""

from __future__ import annotations

from ddptui.contract.protocol import events as ev
from ddptui.contract.state.runstate import RunState


def _stepped(ranks: int, steps: int) -> RunState:
    state = RunState()
    for r in range(ranks):
        state.apply(ev.Rank(rank=r, state="running", pid=100 + r))
    for s in range(steps):
        for r in range(ranks):
            state.apply(ev.Step(rank=r, epoch=0, step=s, global_step=s, loss=1.0 / (1 + s),
                                t=1000.0 + s))
    return state


def test_a_few_ranks_keep_their_loss_in_full_resolution_up_to_1024_points():
    state = _stepped(2, 1000)
    assert [len(line.points) for line in state.loss_lines.values()] == [1000, 1000]


def test_past_16_ranks_each_loss_line_holds_a_charts_width_and_keeps_its_shape():
    state = _stepped(17, 3000)
    lines = state.loss_lines.values()
    assert all(128 <= len(line.points) < 256 for line in lines)
    points = next(iter(lines)).points
    assert points[0][0] < 1000.0 + 30 and points[-1][0] > 1000.0 + 2900  # the whole run
    assert all(a[1] >= b[1] for a, b in zip(points, points[1:], strict=False))  # still falling
