"""What attach keeps beside its log is read back only where it is whole and of this log's job
still going: anything else (cut short, another log's, a job that ended) starts attach empty,
saying why where something was wrong, and never stops it."""

from __future__ import annotations

import json
import os

import pytest

from ddptui.contract.protocol import events as ev
from ddptui.dashboard.sources.attach import Attach
from ddptui.dashboard.sources.kept_state import path_of
from tests.helpers.runs import REPORT_KEY, local_port


def _attach(log: str) -> Attach:
    return Attach(("127.0.0.1", local_port()), REPORT_KEY.encode(), log, "test")


def _said(attach: Attach) -> list[str]:
    return [line[3] for line in attach.state.lines]


def _kept(log: str, *events: ev.Event) -> None:
    """An attach that saw `events`, then detached (keeping its state)."""
    first = _attach(log)
    first.start()
    with first._lock:
        for e in events:
            first._record(e)
    first.stop()


RUNNING = (ev.Run(rank=0, status="started", model="train.py", data="", epochs=0, world_size=2,
                  device_kind="cpu", script="train.py"),
           ev.Rank(rank=0, state="running", pid=11), ev.Rank(rank=1, state="running", pid=12),
           ev.Step(rank=1, epoch=0, step=7, global_step=7, loss=0.5, samples_per_s=10.0))


def test_a_job_still_going_is_taken_up_where_it_was(tmp_path):
    log = str(tmp_path / "job.jsonl")
    _kept(log, *RUNNING)
    attach = _attach(log)
    attach.start()
    try:
        assert sorted(attach.state.ranks) == [0, 1] and attach.state.ranks[1].global_step == 7
        assert "continuing" in _said(attach)[-1]
    finally:
        attach.stop()


@pytest.mark.parametrize("spoil, why", [
    (lambda p, log: open(p, "r+b").truncate(os.path.getsize(p) // 2), "not a state ddptui"),
    (lambda p, log: open(p, "w").write(json.dumps({"version": 1})), "not a state ddptui"),
    (lambda p, log: open(p, "w").write("[1, 2]"), "not a state ddptui"),
    (lambda p, log: open(log, "w").close(), "longer log"),  # the log started again
    (lambda p, log: open(p, "w").write(json.dumps({"version": 99})), "another version"),
    (lambda p, log: _poison(p, meta=[]), "not a state ddptui"),
    (lambda p, log: _poison(p, seq="a"), "not a state ddptui"),
    (lambda p, log: _poison(p, started_t=1e300), "not a state ddptui"),
    (lambda p, log: _poison(p, ranks=[{"rank": 0, "step": "x"}]), "not a state ddptui"),
    (lambda p, log: _poison(p, saved_t=1e300, top=True), "not a state ddptui"),
    (lambda p, log: _poison(p, wrapped=[1e999], top=True), "not a state ddptui"),
    (lambda p, log: open(p, "w").write("[" * 100_000 + "]" * 100_000), "not a state ddptui"),
    (lambda p, log: (os.unlink(p), os.mkfifo(p)), "not a file"),
])
def test_a_kept_state_spoiled_or_of_another_log_starts_attach_empty_and_says_why(
        tmp_path, spoil, why):
    log = str(tmp_path / "job.jsonl")
    _kept(log, *RUNNING)
    spoil(path_of(log), log)
    attach = _attach(log)
    attach.start()
    try:
        assert attach.state.ranks == {}
        assert why in _said(attach)[-1] and _said(attach)[-1].endswith(": starting empty")
    finally:
        attach.stop()
    # and what it keeps now is its own (whole), for the attach after it
    assert json.load(open(path_of(log)))["version"] == 1


def _poison(path: str, top: bool = False, **fields) -> None:
    """The kept state with `fields` (of its run state, or with `top` of the file) set."""
    data = json.load(open(path))
    if "ranks" in fields:  # the rest of the rank as it was
        fields["ranks"] = [{**data["state"]["ranks"][0], **fields["ranks"][0]}]
    (data if top else data["state"]).update(fields)
    open(path, "w").write(json.dumps(data))


def test_a_new_job_on_the_log_of_one_that_ended_unseen_starts_afresh(tmp_path):
    """The kept job ended while no attach watched; a new job's launch on the same log replaces
    it: its ranks only, its own epochs."""
    log = str(tmp_path / "job.jsonl")
    _kept(log, *RUNNING, ev.Epoch(rank=1, epoch=0, seconds=1.0, samples=10, samples_per_s=10.0,
                                  data_wait=0.0, settings={}))
    attach = _attach(log)
    attach.start()
    try:
        assert sorted(attach.state.ranks) == [0, 1] and attach.state.epochs
        attach._received(ev.Run(rank=0, status="started", model="new.py", data="", epochs=0,
                                world_size=1, device_kind="cpu", script="new.py"))
        attach._received(ev.Rank(rank=0, state="running", pid=21))
        assert sorted(attach.state.ranks) == [0] and not attach.state.epochs
        assert attach.state.meta["model"] == "new.py" and attach.state.ranks[0].pid == 21
        assert any("a new job began on this log" in s for s in _said(attach))
    finally:
        attach.stop()


def test_a_job_that_ended_is_not_taken_up(tmp_path):
    log = str(tmp_path / "job.jsonl")
    _kept(log, *RUNNING, ev.Run(rank=0, status="done", exit_code=0))
    attach = _attach(log)
    attach.start()
    try:
        assert attach.state.ranks == {}
        assert not any("continuing" in s or "starting empty" in s for s in _said(attach))
    finally:
        attach.stop()
