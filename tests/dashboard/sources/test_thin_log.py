"""attach's log of a big job stays small: every event for its first minutes, then each rank's
steps rolled up; every step still counted, and a crash written whole, after its rank's steps."""

from __future__ import annotations

from ddptui.contract.protocol.events import Rank, Step
from ddptui.dashboard.sources.thin_log import ThinLog


def _play(ranks: int, seconds: int, crash: tuple[int, float] | None = None) -> list:
    written: list = []
    log = ThinLog(written.append)
    for tick in range(seconds * 20):  # 20 steps a second a rank
        t = 1000.0 + tick / 20
        for r in range(ranks):
            if crash and r == crash[0] and t >= 1000.0 + crash[1]:
                if t == 1000.0 + crash[1]:
                    log.put(Rank(t=t, rank=r, state="crashed", reason="boom"))
                continue
            log.put(Step(t=t, rank=r, epoch=0, step=tick, global_step=tick, loss=1.0,
                         steps=1, samples_per_s=100.0, step_ms=50.0, data_wait=0.0))
    log.close()
    return written


def test_a_big_jobs_steps_are_rolled_up_after_its_first_minutes_and_all_counted():
    written = _play(ranks=20, seconds=600, crash=(5, 450.0))
    steps = [e for e in written if isinstance(e, Step)]
    assert sum(e.steps for e in steps) == 20 * 600 * 20 - 150 * 20  # rank 5's last 150 s
    full = [e for e in steps if e.t < 1300.0]
    assert len(full) == 20 * 300 * 20  # the first five minutes: every step event
    later = [e for e in steps if e.t >= 1300.0 and e.rank == 0]
    assert 4 <= len(later) <= 6  # 300 s more in entries a minute apart
    assert all(e.samples_per_s == 100.0 for e in later)
    crash = next(i for i, e in enumerate(written) if isinstance(e, Rank))
    before = [e for e in written[:crash] if e.rank == 5]
    assert before[-1].step == 450 * 20 - 1  # its last step came before its crash
    assert not [e for e in written[crash:] if e.rank == 5 and isinstance(e, Step)]


def test_a_job_of_two_nodes_keeps_every_step():
    written = _play(ranks=16, seconds=400)
    assert len(written) == 16 * 400 * 20
