"""attach's watch over ranks on other nodes: the rank that never entered the collective is
blamed, and a hung rank stays flagged through torch's own log lines."""

from __future__ import annotations

from ddptui.contract.protocol.codec import event_of


class _Watch:
    """The watch fed events as a rank sends them (dicts, checked as the link checks them)."""

    def __init__(self, recorded: list):
        from ddptui.dashboard.sources.remote_watch import RemoteWatch
        self.inner = RemoteWatch(10.0, lambda ev: recorded.append(ev.fields()), lambda rank: True)

    def observe(self, obj: dict, now: float) -> None:
        ev = event_of({"t": now, **obj})  # sent at `now`, read at once
        assert ev is not None, obj
        self.inner.observe(ev, now)

    def check(self, now: float) -> None:
        self.inner.check(now)


def test_attach_blames_the_rank_on_another_node_that_never_entered_the_collective():
    """Wrapped ranks on two nodes, both stalled with stacks in user code: their flight recorders
    (sent compact over the link) show rank 0 in all_reduce #42, which rank 1 on the other node
    never enqueued: rank 0 is `waiting` for rank 1, named with its node; rank 1 stays stalled."""
    from ddptui.contract.observe.flight import compact
    recorded: list[dict] = []
    watch = _Watch(recorded)

    def trace(*entries):
        return {"entries": [{"pg_id": 0, "profiling_name": "nccl:all_reduce",
                             "collective_seq_id": seq, "state": state} for seq, state in entries]}

    for rank in (0, 1):
        watch.observe({"kind": "rank", "rank": rank, "state": "running", "api": "ddptui.rank.wrap",
                       "host": "vm", "node": f"vm/{rank}", "local_rank": 0}, 0.0)
    watch.inner.flags = {0: ("stalled", 1.0), 1: ("stalled", 1.0)}
    dumps = {0: trace((41, "completed"), (42, "started")), 1: trace((41, "completed"))}
    for rank in (0, 1):
        watch.observe({"kind": "message", "rank": rank, "stacks_of": rank, "level": "info", "text": "",
                       "stacks": 'File "train.py", line 3 in misbehave'}, 2.0)
    assert recorded == []  # both in the script's own code: the stacks alone blame nobody
    for rank, dump in dumps.items():
        watch.observe({"kind": "message", "rank": rank, "stacks_of": rank, "stacks": "NCCL: ...",
                       "level": "info", "text": "",
                       "flight": compact(dump)}, 3.0)
    assert [(e["rank"], e["state"], e["waiting_for"]) for e in recorded] == [(0, "waiting", [1])]
    assert recorded[0]["reason"] == \
        "in all_reduce #42 (NCCL): waiting for rank 1 (node vm/1, local 0)"
    assert watch.inner.flags[1][0] == "stalled"
    # Rank 1 is killed (k): rank 0, still held in the collective 2 s later (NCCL waits out its
    # timeout), cannot go on, said once; a rank that ends a moment after its peer is not stuck.
    watch.observe({"kind": "rank", "rank": 1, "state": "crashed",
                   "reason": "killed by SIGKILL (k)"}, 3.5)
    watch.check(4.0)
    assert [e.get("text") for e in recorded if e["kind"] == "message"] == []
    for now in (6.0, 7.0):
        watch.check(now)
    assert [e["text"] for e in recorded if e["kind"] == "message"] == [
        "rank 0 waits in all_reduce #42 (NCCL) for rank 1, which ended (killed by SIGKILL (k)): "
        "the job cannot go on; K ends it"]


def test_attach_keeps_a_hung_rank_flagged_through_torchs_own_log_lines():
    """Asking a stalled wrapped rank for its flight recorder makes torch log on its stderr (seen
    on 2 x H100: both ranks shown running 0.5 s after the verdict): only the script's own output
    or a step ends the verdict."""
    recorded: list[dict] = []
    watch = _Watch(recorded)
    watch.observe({"kind": "rank", "rank": 1, "state": "running", "api": "ddptui.rank.wrap"}, 0.0)
    watch.observe({"kind": "process", "rank": 1, "status": "sleeping", "cpu_percent": 0.0,
                   "pid": 7, "rss": 1}, 0.5)
    watch.observe({"kind": "output", "rank": 1, "text": "epoch 0 step 9 loss: 1.5",
                   "final": True}, 1.0)
    watch.observe({"kind": "process", "rank": 1, "status": "sleeping", "cpu_percent": 0.0,
                   "pid": 7, "rss": 1}, 12.0)
    watch.check(12.0)
    assert [e["state"] for e in recorded] == ["stalled"]
    torch_says = "[rank1]:[W1126 14:16:43.123456789 ProcessGroupNCCL.cpp:1500] [PG 0 Rank 1] dump"
    watch.observe({"kind": "output", "rank": 1, "text": torch_says, "final": True}, 12.4)
    watch.observe({"kind": "lines", "rank": 1, "lines": [torch_says, torch_says]}, 12.5)
    watch.observe({"kind": "process", "rank": 1, "status": "sleeping", "cpu_percent": 0.0,
                   "pid": 7, "rss": 1}, 13.0)
    watch.check(13.0)
    assert [e["state"] for e in recorded] == ["stalled"]
    watch.observe({"kind": "lines", "rank": 1, "lines": [torch_says, "epoch 0 step 10 loss: 1.4"]},
                  14.0)
    assert [(e["state"], e.get("reason")) for e in recorded][1:] == \
        [("running", "making progress again")]


def test_a_backlog_read_on_reconnecting_is_judged_by_when_it_was_sent():
    """Attach (re)starts while a rank's link holds a backlog: the rank stopped stepping 15 s
    before, on a node whose clock is an hour off. Its backlog's steps, read now, are old news:
    the rank is flagged stalled within a second of attach reading them (judged by when they
    were read, it looked alive for another 10 s), and its stepping peer is never flagged."""
    recorded: list[dict] = []
    watch = _Watch(recorded)
    skew, back = 3600.0, 40.0
    for rank in (0, 1):  # each link says its clock first, then sends what it held
        watch.inner.clock.sync(rank, back + skew, back)
        watch.observe({"kind": "rank", "rank": rank, "state": "running",
                       "api": "ddptui.rank.wrap", "t": 0.0 + skew}, back)

    def tick(sent: float, received: float) -> None:
        for rank in (0, 1):
            watch.observe({"kind": "process", "rank": rank, "status": "running",
                           "cpu_percent": 100.0, "pid": 7 + rank, "rss": 1, "t": sent + skew},
                          received)
            if rank == 0 or sent < 25:  # rank 1 steps no more after 25 s
                watch.observe({"kind": "step", "rank": rank, "epoch": 0, "step": int(sent * 2),
                               "global_step": int(sent * 2), "loss": None, "t": sent + skew},
                              received)

    for half in range(1, 81):  # the backlog: 40 s of events, read at once
        tick(half / 2, back)
    flagged_at = None
    for half in range(81, 121):  # then live, checked twice a second
        tick(half / 2, half / 2)
        watch.check(half / 2)
        if flagged_at is None and any(e["kind"] == "rank" and e["rank"] == 1
                                      and e["state"] == "stalled" for e in recorded):
            flagged_at = half / 2
    assert flagged_at is not None and flagged_at <= back + 1.0
    flagged = [(e["rank"], e["state"]) for e in recorded if e["kind"] == "rank"]
    assert [f for f in flagged if f[0] == 0] == []
    assert flagged.count((1, "stalled")) == 1
