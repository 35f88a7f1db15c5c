"""Which messages a run's events make, and how many: a flapping rank's held for a digest, a
job's hang one message not hundreds, a straggler after a minute."""

from __future__ import annotations

import pytest

from ddptui.contract.monitor.notify import Message, Notifier
from ddptui.contract.monitor.watch import RunWatch
from ddptui.contract.protocol.events import Rank, Run
from ddptui.contract.state.runstate import RunState
from tests.helpers.monitoring import Receiver


def _watch(state: RunState) -> tuple[RunWatch, list[Message]]:
    said: list[Message] = []
    return RunWatch(state, said.append, "r", "r.jsonl"), said


def test_a_hang_of_many_ranks_is_one_message_that_names_them():
    state = RunState()
    watch, said = _watch(state)
    for rank in range(8):
        state.apply(Rank(t=1.0, rank=rank, state="running"))
    watch.check(state.view(), 1.0)
    for rank in range(8):
        state.apply(Rank(t=2.0, rank=rank, state="stalled", reason="no step for 60 s"))
    watch.check(state.view(), 2.0)
    watch.check(state.view(), 10.0)  # no stacks came: said after waiting for them
    assert [(m.event, m.rank) for m in said] == [("stalled", None)]
    assert said[0].text.startswith("run r: ranks 0-7 stalled; the first: rank 0 stalled")


def test_a_rank_stalled_then_killed_within_a_look_is_told_in_order_and_the_end_once():
    state = RunState()
    watch, said = _watch(state)
    state.apply(Rank(t=1.0, rank=1, state="running"))
    state.apply(Rank(t=2.0, rank=1, state="stalled", reason="no step for 2 s"))
    state.apply(Rank(t=2.5, rank=1, state="crashed", reason="killed by ddptui"))
    state.apply(Run(t=3.0, rank=-1, status="failed", exit_code=1, reason="rank 1 failed"))
    watch.check(state.view(), 3.0)
    watch.check(state.view(), 4.0)
    assert [(m.event, m.rank) for m in said] == [("stalled", 1), ("crashed", 1), ("failed", None)]
    assert said[1].cause == "killed by ddptui"


def test_a_rank_slow_for_a_minute_is_a_straggler_once():
    state = RunState()
    watch, said = _watch(state)
    state.apply(Rank(t=1.0, rank=2, state="slow", reason="18% slower than the median"))
    for now in (1.0, 30.0, 61.5, 90.0, 200.0):
        watch.check(state.view(), now)
    assert [(m.event, m.rank) for m in said] == [("straggler", 2)]
    assert "18% slower" in said[0].text


def test_a_flapping_rank_gets_one_message_then_a_digest():
    pytest.importorskip("apprise")
    receiver = Receiver()
    notifier = Notifier([receiver.url], None, lambda text: None)
    try:
        for _ in range(3):
            notifier.notify(Message("crashed", "run r: rank 3 crashed", "r", rank=3))
        notifier.notify(Message("crashed", "run r: rank 4 crashed", "r", rank=4))
        notifier.close()
    finally:
        receiver.close()
    assert [(b["event"], b["rank"]) for b in receiver.bodies] == [
        ("crashed", "3"), ("crashed", "4"), ("digest", "")]
    assert receiver.bodies[-1]["text"] == "2 more: rank 3 crashed x2"
