"""The health logic on its own, in milliseconds: which member is stalled and which only wait
for it, which is a straggler and why, and the figures the run state derives (no processes)."""

from __future__ import annotations

from ddptui.contract.observe.stacks import innermost
from ddptui.contract.protocol.events import Gpu
from ddptui.contract.stalls.health import Seen, Stragglers, judge_stalls, stall_limit
from ddptui.contract.state.runstate import RunState
from ddptui.dashboard.view.widgets.header import RunHeader
from tests.helpers.runlogs import logged, typed

NOW = 1000.0


def _seen(slot, since=NOW - 30, beat_t=NOW - 0.2, step=100, phase="compute", **kw) -> Seen:
    return Seen(slot, since, step_s=0.05, beat_t=beat_t, global_step=step, phase=phase, **kw)


def test_a_world_that_steps_has_no_verdicts():
    assert judge_stalls([_seen(0, since=NOW - 1), _seen(1, since=NOW - 1)], NOW, None) == {}


def test_a_stopped_process_is_the_stalled_one_and_the_others_wait_for_it():
    v = judge_stalls([_seen(0), _seen(1, beat_t=NOW - 20, status="stopped")], NOW, None)
    assert v[1].state == "stalled" and v[0].state == "waiting"
    assert v[1].fields["process"] == "stopped" and "no step for 30 s" in v[1].reason
    assert v[0].fields["waiting_for"] == [1]


def test_a_rank_stuck_in_its_own_input_is_stalled_while_its_peer_waits_in_the_collective():
    v = judge_stalls([_seen(0, phase="compute"), _seen(1, phase="input")], NOW, None)
    assert (v[0].state, v[1].state) == ("waiting", "stalled")
    assert v[1].fields["phase"] == "input"


def test_a_rank_waiting_in_a_collective_is_not_blamed_before_its_culprit_crosses_the_limit():
    """Seen on CI with --stall-after 2: rank 0's last step was reported 0.5 s before rank 1's,
    so rank 0 (waiting in DDP's broadcast) crossed the limit first and was killed as the
    stalled one while rank 1 hung in its own input."""
    ranks = [_seen(0, since=NOW - 2.2), _seen(1, since=NOW - 1.7, phase="input")]
    assert judge_stalls(ranks, NOW, 2.0) == {}  # nothing singles rank 0 out: not yet
    v = judge_stalls(ranks, NOW + 0.5, 2.0)  # both past it: the evidence decides
    assert (v[0].state, v[1].state) == ("waiting", "stalled")
    # A member stuck with no evidence while the others go on is stalled after twice the limit.
    v = judge_stalls([_seen(0, since=NOW - 4.1), _seen(1, since=NOW - 0.1)], NOW, 2.0)
    assert (v[0].state, v[1].state) == ("stalled", "waiting")


def test_a_rank_in_validation_waits_for_a_stopped_peer_instead_of_being_blamed():
    """Seen on CI: the peer was SIGSTOPped at an epoch's end, rank 0 sat in validation's
    all_reduce; both were called stalled."""
    v = judge_stalls([_seen(0, phase="validate", step=16),
                      _seen(1, beat_t=NOW - 20, step=None, phase="", status="stopped")], NOW, None)
    assert (v[0].state, v[1].state) == ("waiting", "stalled")
    assert v[0].fields["waiting_for"] == [1]


def test_the_rank_behind_the_others_is_stalled():
    v = judge_stalls([_seen(0, step=105), _seen(1, step=100), _seen(2, step=105)], NOW, None)
    assert [v[s].state for s in (0, 1, 2)] == ["waiting", "stalled", "waiting"]


def test_when_nothing_singles_a_rank_out_every_stuck_member_is_stalled():
    v = judge_stalls([_seen(0), _seen(1)], NOW, None)
    assert {s.state for s in v.values()} == {"stalled"}


def test_the_limit_follows_the_step_time_and_spares_a_first_step():
    assert stall_limit(None, None) == 10.0
    assert stall_limit(2.0, None) == 40.0  # 20 median steps
    assert stall_limit(0.01, 3.0) == 3.0  # --stall-after wins
    assert stall_limit(0.01, 3.0, started=False) == 60.0  # autotuning, compiling
    fresh = _seen(1, since=NOW - 30, beat_t=NOW - 20, status="stopped", started=False)
    assert judge_stalls([_seen(0, since=NOW - 1), fresh], NOW, None) == {}


def test_a_gpu_figure_says_busy_or_idle():
    v = judge_stalls([_seen(0, gpu_util=0.0, status="sleeping", phase="input")], NOW, None)
    assert v[0].fields["gpu_activity"] == "idle" and "host is stuck" in v[0].reason


def _fill(stragglers, slot, step_ms, wait, events=12, steps=2):
    for _ in range(events):
        stragglers.add(slot, steps, step_ms, wait)


def test_a_rank_waiting_on_its_input_is_slow_with_cause_data_wait():
    s = Stragglers()
    _fill(s, 0, 100.0, 0.02)
    _fill(s, 1, 100.0, 0.40)  # lockstep: the same step time, but 40 ms of it waiting for input
    _fill(s, 2, 100.0, 0.01)
    verdict = s.judge([0, 1, 2], {})
    assert list(verdict) == [1] and verdict[1].startswith("data-wait")


def test_slow_names_the_gpu_cause_or_plain_compute():
    s = Stragglers()
    _fill(s, 0, 100.0, 0.0)
    _fill(s, 1, 130.0, 0.0)
    assert s.judge([0, 1], {1: Gpu(rank=1, gpu=1, held_down=["thermal"])})[1] == \
        "GPU clocks held down: thermal"
    assert s.judge([0, 1], {1: Gpu(rank=1, gpu=1, others=[[4242, 900]])})[1].startswith("another process")
    assert s.judge([0, 1], {})[1].startswith("compute")


def test_no_straggler_without_a_full_window_or_among_equals():
    s = Stragglers()
    _fill(s, 0, 100.0, 0.0, events=3)
    _fill(s, 1, 200.0, 0.0, events=3)
    assert s.judge([0, 1], {}) == {}  # 6 steps each: under the 20-step window
    s = Stragglers()
    _fill(s, 0, 100.0, 0.1)
    _fill(s, 1, 104.0, 0.1)
    assert s.judge([0, 1], {}) == {}


def test_innermost_frames_of_the_main_thread():
    dump = ('Thread 0x00007f01 (most recent call first):\n'
            '  File "/x/threading.py", line 320 in wait\n\n'
            'Current thread 0x00007f00 (most recent call first):\n'
            '  File "/x/userpkg.py", line 12 in block_forever_here\n'
            '  File "/x/userpkg.py", line 40 in __getitem__\n'
            '  File "/x/data.py", line 60 in _load\n'
            '  File "/x/rank_main.py", line 9 in main\n')
    assert innermost(dump) == ("block_forever_here (userpkg.py:12) < __getitem__ "
                               "(userpkg.py:40) < _load (data.py:60)")


def _step(t, rank, gs, progress, step_ms=1400.0, bs=32):
    return {"t": t, "kind": "step", "rank": rank, "epoch": 0, "step": gs, "global_step": gs,
            "loss": 1.0, "samples_per_s": bs * 1000 / step_ms, "step_ms": step_ms,
            "data_wait": 0.0, "progress": progress, "steps": 1}


def test_slow_steps_still_count_in_throughput_and_progress_never_passes_100():
    state = RunState({"epochs": 1, "steps_per_epoch": 10}, live=False)
    state.apply(typed({"t": 0.0, "kind": "run", "rank": -1, "status": "started"}))
    for r in range(4):
        state.apply(typed({"t": 0.0, "kind": "rank", "rank": r, "state": "running"}))
    for i in range(1, 6):  # 4 ranks at 1.4 s a step
        for r in range(4):
            state.apply(typed(_step(1.4 * i, r, i, i / 10)))
    view = state.view()
    assert round(view.throughput) == round(4 * 32 / 1.4)
    # A world of 1 takes more steps in the epoch than the 10 planned for a world of 4.
    state.apply(typed(_step(20.0, 0, 30, 0.97)))
    assert 0.96 < state.view().progress[-1] <= 1.0


def test_a_peer_row_cut_by_a_settings_change_does_not_bring_the_old_settings_back():
    """Rank 0 reports its part of the epoch, then the applied settings; rank 1's part, under
    the old settings, comes last. What is in force is what was applied."""
    state = RunState({"epochs": 2}, live=False)
    old, new = {"workers": 0, "prefetch": True}, {"workers": 1, "prefetch": True}
    state.apply(typed({"t": 0.0, "kind": "settings", "rank": 0, "settings": old, "status": "applied"}))
    part = {"kind": "epoch", "epoch": 0, "start_step": 0, "end_step": 5, "partial": True,
            "settings": old, "world_size": 2, "samples_per_s": 100.0, "data_wait": 0.0,
            "seconds": 0.5, "samples": 50, "train_loss": 2.0}
    state.apply(typed({"t": 1.0, "rank": 0, **part}))
    state.apply(typed({"t": 1.0, "kind": "settings", "rank": 0, "settings": new, "status": "applied",
                 "epoch": 0, "step": 5}))
    state.apply(typed({"t": 1.1, "rank": 1, **part}))
    assert state.view().settings == new and state.view().epochs[0]["settings"] == old


def test_rank_0s_echo_of_an_older_request_does_not_undo_keys_pressed_since():
    """W W w quickly: rank 0 echoes each request as it takes it; the echo of the first, arriving
    after the second was asked for, must not turn 2 back into 1 (CI saw W W w send 1, 2, 0)."""
    state = RunState({"epochs": 2}, live=False)
    base = {"workers": 0, "prefetch": True}
    state.apply(typed({"t": 0.0, "kind": "settings", "rank": -1, "settings": base, "status": "applied"}))

    def ask(t, rid, workers):
        state.apply(typed({"t": t, "kind": "settings", "rank": -1, "settings": {"workers": workers},
                     "status": "requested", "request": rid}))

    def echo(t, rid, workers):
        state.apply(typed({"t": t, "kind": "settings", "rank": 0, "status": "pending", "request": rid,
                     "settings": {**base, "workers": workers}, "epoch": 1}))

    ask(1.0, "r1", 1)
    ask(1.1, "r2", 2)
    echo(1.2, "r1", 1)
    assert state.vitals().pending == {"workers": 2}
    ask(1.3, "r3", 1)
    echo(1.4, "r2", 2)
    assert state.vitals().pending == {"workers": 1}
    echo(1.5, "r3", 1)
    assert state.vitals().pending == {"workers": 1}
    # `a`, then W before the change lands: the applied event leaves the newer request pending.
    ask(1.6, "r4", 2)
    state.apply(typed({"t": 1.7, "kind": "settings", "rank": 0, "status": "applied", "epoch": 0,
                 "step": 5, "settings": {**base, "workers": 1}}))
    assert state.vitals().pending == {"workers": 2}
    echo(1.8, "r4", 2)
    assert state.vitals().pending == {"workers": 2} and state.vitals().settings["workers"] == 1


def test_space_pressed_twice_before_the_ranks_answer_means_pause_then_resume():
    """What the keys build on and what the header says while the ranks have not answered."""
    state = RunState({"epochs": 2}, live=False)
    header = RunHeader()

    def run(t, rank, status):
        state.apply(typed({"t": t, "kind": "run", "rank": rank, "status": status}))
        header.view = state.view()
        return header.render().plain

    run(0.0, -1, "started")
    state.apply(typed(_step(0.5, 0, 1, 0.1)))
    assert " PAUSING " in run(1.0, -1, "pausing")
    assert state.vitals().pause_asked is True and not state.vitals().paused
    assert " RUNNING " in run(1.1, -1, "resuming")  # where the two orders leave the ranks
    # The first order's answer: the second is still on its way, and the header says so.
    assert " RESUMING " in run(1.2, 0, "paused")
    assert state.vitals().paused and state.vitals().pause_asked is False
    assert " RUNNING " in run(1.3, 0, "resumed")
    assert state.vitals().pause_asked is None
    assert " PAUSED " in run(1.4, 0, "paused")  # paused from elsewhere (attach, the autotuner)


def test_cpu_ranks_show_the_prefetcher_as_not_applicable():
    from ddptui.contract.state.runstate import RunState

    state = RunState({"device_kind": "cpu"})
    state.apply(typed(logged("rank", 0, state="running")))
    state.apply(typed(logged("epoch", 0, epoch=0, samples=64, seconds=1.0, samples_per_s=64.0,
                      data_wait=0.0, settings={"prefetch": True, "workers": 1,
                                               "cudnn_benchmark": False})))
    (line,) = [text for *_, text, kind in state.lines_after(0) if text.startswith("epoch 0")]
    assert "[prefetch n/a, workers 1" in line


def test_a_scripts_restarted_group_gets_epoch_rows_of_its_own():
    state = RunState({"script": "train.py", "world_size": 2})
    for restart, losses in ((0, (2.0, 1.5)), (1, (1.4, 1.2))):
        state.apply(typed({"t": NOW, "kind": "run", "rank": -1, "status": "started",
                     "restart": restart}))
        for epoch, loss in enumerate(losses):
            for rank in (0, 1):
                state.apply(typed({"t": NOW + epoch, "kind": "epoch", "rank": rank, "epoch": epoch,
                             "seconds": 1.0, "samples": 0, "samples_per_s": 0.0,
                             "data_wait": 0.0, "settings": {}, "train_loss": loss}))
    rows = [(e["restart"], e["epoch"], e["train_loss"]) for e in state.view().epochs]
    assert rows == [(0, 0, 2.0), (0, 1, 1.5), (1, 0, 1.4), (1, 1, 1.2)]
