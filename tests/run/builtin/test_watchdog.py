"""The built-in loop's watchdog decides and returns actions: a frozen member is flagged and, with
--on-stall recover, killed once its stacks are in; no verdict while the run is paused or its world
changes (a recovering member may take seconds to take its old world down). No process is started."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddptui.contract.protocol.events import Stacks, Step
from ddptui.run.actions import Flag, Kill, Record
from ddptui.run.builtin.watchdog import Member, Watchdog

# A member's stand-in: like a rank, it has its stacks handler before anyone asks (a process
# with none is not asked: the signal's default would end it).
MEMBER = ("import signal, sys, time; signal.signal(signal.SIGUSR1, lambda *_: None); "
          "print('ready', flush=True); time.sleep(60)")


@pytest.fixture
def pids():
    """Two processes to stand for the members."""
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        assert p.stdout.readline() == "ready\n"
    yield [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def _watchdog(tmp_path, pids) -> tuple[Watchdog, list[Member]]:
    dog = Watchdog(2.0, recover=True, enabled=True, process=lambda pid: ("stopped", 0.0))
    members = [Member(s, pids[s], None, str(tmp_path / f"stacks{s}")) for s in (0, 1)]
    dog.restart_clock([0, 1], 100.0)  # the world formed at t=100
    for s in (0, 1):
        dog.observe(Step(rank=s, t=100.0, epoch=0, step=1, global_step=1, loss=None,
                         step_ms=50.0))
    return dog, members


def test_a_frozen_member_is_flagged_then_killed_once_its_stacks_are_in(tmp_path, pids):
    dog, members = _watchdog(tmp_path, pids)
    acted = dog.check(130.0, members, held=False)
    assert {(a.slot, a.state) for a in acted if isinstance(a, Flag)} == {(0, "stalled"),
                                                                          (1, "stalled")}
    (tmp_path / "stacks0").write_text('File "x.py", line 3 in block_forever_here\n')
    later = dog.check(200.0, members, held=False)
    assert any(isinstance(a, Record) and isinstance(a.event, Stacks) and a.event.stacks_of == 0
               for a in later)
    assert any(isinstance(a, Kill) and a.slot == 0 for a in later)


def test_no_verdict_while_the_world_changes_or_the_run_is_paused(tmp_path, pids):
    dog, members = _watchdog(tmp_path, pids)
    assert dog.check(130.0, members, held=True) == []
    assert dog.flags == {}
    assert dog.check(131.0, members, held=False)  # the same silence, once the world is formed
