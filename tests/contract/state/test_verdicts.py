"""The verdicts from the phases, on figures made up to the point: a world slower than its own
best, a data-bound rank and its workers, an even world with nobody named, a window of nonsense
from outside left out."""

from __future__ import annotations

from ddptui.contract.protocol.codec import event_of
from ddptui.contract.state.steptime import StepTimes
from ddptui.contract.state.verdicts import judge

BASE = {"data": 1.0, "forward": 30.0, "backward": 50.0, "comm": 4.0, "optimizer": 4.0,
        "rest": 1.0}


def window(rank: int, t: float, **slower: float) -> dict:
    means = {p: ms * slower.get(p, 1.0) for p, ms in BASE.items()}
    return {"kind": "phases", "t": t, "rank": rank, "steps": 10,
            "step_ms": sum(means.values()), "step_p90_ms": sum(means.values()),
            "phases": {p: [ms, ms] for p, ms in means.items()}, "measured": list(means),
            "clock": "host"}


def book(*windows: dict) -> StepTimes:
    times = StepTimes()
    for w in windows:
        times.take(event_of(w))
    return times


def test_an_even_world_names_nobody():
    times = book(*(window(r, t) for t in range(8) for r in range(4)))
    assert judge(times.ranks) == []


def test_a_world_slower_than_its_own_best_is_said_with_the_phase_that_grew():
    early = [window(r, t) for t in range(6) for r in range(2)]
    late = [window(r, 10 + t, data=20.0) for t in range(5) for r in range(2)]
    found, *rest = sorted(judge(book(*early, *late).ranks), key=lambda f: f.kind)
    assert found.kind == "behind_best" and found.rank is None
    assert [f.text for f in rest] == ["rank 0: data-wait 18% of its step",
                                      "rank 1: data-wait 18% of its step"]
    assert found.text == ("every rank is 21% slower than its own best (109.0 ms a step against "
                          "90.0 ms); most of it in data-wait"), found.text


def test_a_data_bound_rank_is_the_straggler_with_its_workers():
    ws = [window(r, t, data=20.0 if r == 1 else 1.0) for t in range(5) for r in range(2)]
    found = judge(book(*ws).ranks, settings={"workers": 2})
    assert found[0].text.startswith("rank 1: 22% slower than the median; its data-wait +19.0 ms "
                                    "a step: 2 DataLoader workers"), found[0].text
    assert [f.kind for f in found] == ["slow"]  # its data-wait said once, in the line above


def test_a_window_that_does_not_fit_its_kind_is_no_event():
    bad = window(0, 1.0)
    bad["phases"] = "a lot"
    assert event_of(bad) is None
    odd = window(0, 1.0)
    odd["phases"]["forward"] = ["x", 1]  # a phase of nonsense: left out of the figures
    times = book(odd)
    assert "forward" not in times.ranks[0].total_ms
