"""A job of hundreds of ranks sends its steps rolled up: the figures of a second's steps, exact
to each one's definition, and nothing moved across a state change."""

from __future__ import annotations

import pytest

from ddptui.contract.protocol.events import Gpu, Process, Rank, Step
from ddptui.contract.rollup import fold, rollup_seconds


def _step(i: int, ms: float, per_s: float, loss: float | None, wait: float) -> Step:
    return Step(t=100.0 + i, rank=3, epoch=0, step=i, global_step=i, loss=loss, steps=2,
                samples_per_s=per_s, step_ms=ms, data_wait=wait, progress=i / 100)


def test_a_seconds_steps_fold_into_one_with_its_figures_over_the_whole_span():
    # Two intervals of 2 steps: 100 ms steps at 640 img/s, then 300 ms steps at 320 img/s.
    a, b = _step(1, 100.0, 640.0, 2.0, 0.5), _step(2, 300.0, 320.0, None, 0.1)
    gpu1, gpu2 = (Gpu(rank=3, gpu=0, util=u) for u in (10.0, 90.0))
    folded = fold([a, gpu1, b, gpu2])
    assert [type(e) for e in folded] == [Step, Gpu]
    step = folded[0]
    assert (step.step, step.global_step, step.progress, step.steps) == (2, 2, 0.02, 4)
    # 0.2 s at 640 img/s + 0.6 s at 320 img/s = 320 samples over 0.8 s.
    assert step.samples_per_s == pytest.approx(400.0)
    assert step.step_ms == pytest.approx(200.0)
    assert step.data_wait == pytest.approx((0.5 * 0.2 + 0.1 * 0.6) / 0.8)
    assert step.loss == 2.0  # the only loss read in the span
    assert folded[1].util == 90.0  # the latest reading


def test_nothing_crosses_a_state_change_and_epochs_stay_apart():
    crashed = Rank(rank=3, state="crashed", reason="boom")
    before, after = _step(1, 100.0, 640.0, 1.0, 0.0), _step(2, 100.0, 640.0, 1.0, 0.0)
    next_epoch = after.replace(epoch=1, step=0)
    folded = fold([before, Process(rank=3, pid=1, status="running", cpu_percent=1.0, rss=1),
                   crashed, after, next_epoch])
    assert [type(e).__name__ for e in folded] == ["Step", "Process", "Rank", "Step", "Step"]
    assert [e.epoch for e in folded if isinstance(e, Step)] == [0, 0, 1]


def test_a_job_above_two_nodes_rolls_up_unless_told(monkeypatch):
    monkeypatch.delenv("DDPTUI_ROLLUP_S", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert rollup_seconds() == 0.0
    monkeypatch.setenv("WORLD_SIZE", "64")
    assert rollup_seconds() == 1.0
    monkeypatch.setenv("DDPTUI_ROLLUP_S", "0")
    assert rollup_seconds() == 0.0


def test_a_ranks_phase_windows_fold_into_one_over_all_their_steps():
    """What attach keeps of a big job's phases once its log thins: the report's totals (steps x
    mean a phase) are those of the windows it folded; the 90th percentile is the higher."""
    from ddptui.contract.protocol.steptime import Phases

    def window(t: float, steps: int, forward: float, peak: float) -> Phases:
        return Phases(t=t, rank=3, steps=steps, step_ms=forward + 10, step_p90_ms=forward + 12,
                      phases={"forward": [forward, forward + 2], "rest": [10.0, 10.0]},
                      measured=["forward", "rest"], clock="cuda", epoch=0, mem_peak=peak)

    (one,) = fold([window(1.0, 10, 20.0, 500.0), window(2.0, 30, 40.0, 400.0)])
    assert one.steps == 40 and one.t == 2.0
    assert one.phases["forward"] == [35.0, 42.0] and one.step_ms == 45.0
    assert one.step_p90_ms == 52.0 and one.mem_peak == 500.0
