"""The command offer cadence on its own, in a one-rank gloo world (no supervisor, no spawn): it
follows time, so a key waits about the same whatever the step time (a clock stands in for the
steps' duration, so the test does not depend on how fast this machine is)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from ddptui.rank.elastic import control
from ddptui.rank.elastic.control import Control


class ListMailbox:
    """What rank 0's mailbox thread would have queued from the supervisor's pipe."""

    def __init__(self):
        self.queued: list[dict] = []

    def drain(self) -> list[dict]:
        out, self.queued = self.queued, []
        return out


@pytest.fixture
def gloo_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield dist.new_group(backend="gloo")
    dist.destroy_process_group()


def _steps_until_agreed(step_s: float, monkeypatch, group, warm: int = 400) -> tuple[list, int]:
    clock = [0.0]
    monkeypatch.setattr(control.time, "perf_counter", lambda: clock[0])
    box = ListMailbox()
    c = Control(box, 0, group)
    gaps = []
    for _ in range(warm):  # steady state: the agreed gap settles
        clock[0] += step_s
        c.poll()
        gaps.append(c._gap)
    box.queued.append({"op": "pause"})
    for steps in range(1, 1000):
        clock[0] += step_s
        if c.poll():
            return gaps, steps
    raise AssertionError("the command was never agreed")


def test_fast_steps_offer_about_every_50_ms_without_drifting(monkeypatch, gloo_world):
    gaps, steps = _steps_until_agreed(0.02, monkeypatch, gloo_world)
    assert set(gaps[-300:]) <= {2, 3}  # 50 ms is 2.5 steps of 20 ms: steady, no swinging
    assert steps <= 2 * 3  # offered at the next offer, read one offer later: ~0.1 s


def test_slow_steps_agree_a_command_at_the_next_step(monkeypatch, gloo_world):
    gaps, steps = _steps_until_agreed(1.4, monkeypatch, gloo_world, warm=20)
    assert set(gaps[-10:]) == {1}
    assert steps == 1  # read in the step it was offered: a key waits one step, not eight
