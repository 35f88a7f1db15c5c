"""Ranks that print nothing, as most scripts' ranks but 0 do: one that trains is never called
stalled, one asleep is, and the peer it holds up in DDP's forward (its buffers' broadcast) waits
for it; asking a rank for its stacks never kills it, even as its interpreter ends."""

from __future__ import annotations

import os
import signal

import pytest

from tests.helpers.runs import ROOT, assert_gone, ddptui, events, run_pids, start_ddptui, wait_for_event

QUIET = os.path.join(ROOT, "tests", "helpers", "scripts", "quiet.py")


@pytest.mark.timeout(240)
def test_a_rank_that_trains_and_prints_nothing_is_never_stalled(env, tmp_path):
    """90 s at the default --stall-after (60 s): rank 1 says one line as it starts, then only
    trains (its optimizer steps are its sign of life)."""
    log = tmp_path / "quiet.jsonl"
    r = ddptui(["run", "--cpus", "2", "--log", str(log), QUIET, "--seconds", "90",
                "--step-seconds", "0.2"], env, tmp_path, timeout=220)
    assert r.returncode == 0, r.stderr[-2000:]
    states = [(e["rank"], e.get("state")) for e in events(log, "rank")]
    assert states.count((1, "running")) == 1 and (1, "done") in states
    assert not [s for s in states if s[1] in ("stalled", "waiting")], states


@pytest.mark.timeout(120)
def test_a_rank_asleep_before_its_forward_is_stalled_and_its_peer_waits_in_ddps_broadcast(
        env, tmp_path):
    log = tmp_path / "asleep.jsonl"
    p = start_ddptui(["run", "--cpus", "2", "--stall-after", "3", "--grace", "3", "--log",
                      str(log), QUIET, "--seconds", "600", "--asleep-rank", "1"], env, tmp_path)
    try:
        waiting = wait_for_event(log, lambda e: e.get("state") == "waiting", 60)
        assert waiting["rank"] == 0 and waiting["waiting_for"] == [1]
        assert "(DDP)" in waiting["phase"], waiting
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 1 and e.get("stacks"), 15)
        assert "asleep_here" in stacks["text"]
        shown = {e["rank"]: e["state"] for e in events(log, "rank") if e.get("state")}
        assert shown == {0: "waiting", 1: "stalled"}
        pids = run_pids(log)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130, err[-2000:]
    assert_gone(pids)


@pytest.mark.timeout(90)
def test_stacks_asked_of_a_rank_in_its_last_seconds_never_kill_it(env, tmp_path):
    """Rank 0 lingers silent with faulthandler's handlers gone (its interpreter ending): flagged,
    its stacks are not asked with a signal that would end it, and it exits with its own 0."""
    log = tmp_path / "ending.jsonl"
    r = ddptui(["run", "--cpus", "2", "--stall-after", "2", "--log", str(log), QUIET,
                "--seconds", "3", "--end-unhandled"], env, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert 0 in {e["rank"] for e in events(log, "rank") if e.get("state") == "stalled"}
    said = [e["text"] for e in events(log, "message") if e.get("stacks_of") == 0]
    assert said and "no stacks handler" in said[0]
    assert [e["exit_code"] for e in events(log, "rank") if e.get("state") == "done"] == [0, 0]
