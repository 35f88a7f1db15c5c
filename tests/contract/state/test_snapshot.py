"""A dashboard that attaches to a running run gets its state whole, then the events that follow:
it must come to the same screen as one that saw every event (tables, charts, event lines)."""

from __future__ import annotations

import json
import os

import pytest

from ddptui.contract.jsonl import read_events
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.snapshot import dump, load
from tests.helpers.runlogs import gpu_run, phased_run, script_run, typed
from tests.helpers.runs import ROOT

RECORDED = os.path.join(ROOT, "tests", "data", "run-2cpu.jsonl")


@pytest.mark.parametrize("evs", [read_events(RECORDED),
                                 [typed(e) for e in gpu_run(ranks=4, trouble=True)],
                                 [typed(e) for e in script_run()],
                                 [typed(e) for e in phased_run(finished=True)]],
                         ids=["recorded", "gpus", "script", "phases"])
def test_a_snapshot_and_the_events_after_it_draw_what_every_event_drew(evs):
    seen_all, attached = RunState(live=False), None
    for i, ev in enumerate(evs):
        if i == len(evs) // 2:  # mid-run, through JSON as over the socket
            attached = load(json.loads(json.dumps(dump(seen_all))), live=False)
        seen_all.apply(ev)
        if attached is not None:
            attached.apply(ev)
    assert attached is not None
    assert attached.view() == seen_all.view()
    assert attached.charts() == seen_all.charts()
    assert attached.lines_after(0) == seen_all.lines_after(0)
    assert attached.unanswered() == seen_all.unanswered()
    assert attached.steptimes.copy() == seen_all.steptimes.copy()  # the phases' screen, whole
