"""A run's socket under abuse, as a careless script or a hostile process of the same user would
send: every order is checked before it acts (each bad one is refused, the first few with a line
each naming the dashboard's pid, the rest summed up, and the run trains on), and the dashboards
it serves are bounded in number, in threads and in what they may lag behind (the bounds on what
one dashboard sends: test_host_bounds.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddptui.contract.runs.runtime_dir import RuntimeDir
from ddptui.contract.socket.viewers import frame
from ddptui.dashboard.background import connect
from ddptui.run.builtin.supervisor import Supervisor
from ddptui.run.host.host import MAX_BEHIND, MAX_VIEWERS, RunHost
from ddptui.run.host.order_check import max_workers
from ddptui.run.host.refusals import SAID
from tests.helpers.runs import (
    TINY,
    assert_gone,
    detached,
    events,
    run_config,
    run_pids,
    viewer_lines,
    wait_for_event,
)

DROPPED = "warning: a dashboard's message was dropped: "

# Each order as a dashboard sends it, then values that make it one the run must not carry out.
VALID = {"settings": {"op": "settings", "settings": {"workers": 1}, "request": "r1"},
         "stop": {"op": "stop", "code": 130}, "stop_rank": {"op": "stop_rank", "rank": 1},
         "restart_rank": {"op": "restart_rank", "rank": 1},
         "kill_rank": {"op": "kill_rank", "rank": 1}, "stacks": {"op": "stacks", "rank": 1},
         "restart_group": {"op": "restart_group", "kill": None}}
NOT_INT = st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=8),
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                         st.integers(), max_size=2))
BAD = {("settings", "settings"): st.one_of(
           st.fixed_dictionaries({"workers": st.one_of(st.integers(max_value=-1),
                                                       st.integers(min_value=max_workers() + 1),
                                                       NOT_INT)}),
           st.dictionaries(st.text(max_size=8).filter(
               lambda k: k not in ("workers", "prefetch", "cudnn_benchmark")), st.integers(),
               min_size=1, max_size=2),
           st.just({})),
       ("settings", "request"): st.one_of(NOT_INT.filter(lambda v: not isinstance(v, str)),
                                          st.just(""), st.text(min_size=65)),
       ("stop", "code"): st.one_of(st.integers(max_value=-1), st.integers(min_value=256),
                                   NOT_INT),
       ("stop_rank", "rank"): st.one_of(st.integers(min_value=2), st.integers(max_value=-1),
                                        NOT_INT),
       ("restart_rank", "rank"): st.one_of(st.integers(min_value=2), NOT_INT),
       ("kill_rank", "rank"): st.one_of(st.integers(max_value=-1), NOT_INT),
       ("stacks", "rank"): st.one_of(st.integers(min_value=99), NOT_INT),
       ("restart_group", "kill"): st.one_of(st.none(), st.integers())}  # the built-in loop: never


@st.composite
def bad_orders(draw) -> bytes:
    """An order with one field made bad, an unknown op, or a line that is no order at all."""
    kind = draw(st.sampled_from(["field", "op", "line"]))
    if kind == "field":
        op, field = draw(st.sampled_from(sorted(BAD)))
        return frame({**VALID[op], field: draw(BAD[op, field])})
    if kind == "op":
        op = draw(st.one_of(st.text(max_size=12), NOT_INT).filter(
            lambda o: not isinstance(o, str) or o not in VALID and o not in (
                "pause", "resume", "checkpoint", "apply")))
        return frame({"op": op})
    return draw(st.binary(max_size=40).filter(lambda b: b"\n" not in b and b.strip())) + b"\n"


def _dropped(viewer) -> int:
    return len([line for line in viewer_lines(viewer) if line.startswith(DROPPED)])


def _last(viewer) -> str:
    return [line for line in viewer_lines(viewer) if line.startswith(DROPPED)][-1]


def _summed(lines: list[str]) -> int:
    """The orders the run refused without a line each, as its sums say."""
    return sum(int(m[1].replace(",", "")) for line in lines
               if (m := re.search(r"dropped ([\d,]+) more orders from dashboard pid ", line)))


@pytest.mark.timeout(300)
def test_every_bad_order_is_refused_and_said_and_the_run_trains_on(env, tmp_path):
    log = tmp_path / "fuzz.jsonl"
    pid, path = detached(env, log)
    pids = run_pids(log) | {pid}
    watcher = connect(path)
    watcher.start()
    threads = psutil.Process(pid).num_threads()
    sent = 0
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)

            def send(line: bytes) -> None:
                nonlocal sent
                s.sendall(line)
                sent += 1
                deadline = time.monotonic() + 30
                while sent <= SAID and _dropped(watcher) < sent:  # the first few: a line each
                    assert time.monotonic() < deadline, f"no line for {line[:80]!r}"
                    time.sleep(0.02)

            # What the review found: each is refused before it acts, in one line.
            for order, why in [
                ({"op": "settings", "settings": {"workers": -3}, "request": "x1"},
                 f"settings: workers -3 is not 0-{max_workers()} on this host"),
                ({"op": "settings", "settings": {"workers": 100000}, "request": "x2"},
                 f"settings: workers 100000 is not 0-{max_workers()} on this host"),
                ({"op": "stop", "code": 1e20}, "stop: bad code"),
                ({"op": "stop", "code": 99999}, "stop: exit code 99999 is not 0-255"),
                ({"op": []}, "unknown op '[]'"),
                ({"op": "restart_group", "kill": None},
                 "restart_group: this run restarts rank by rank, not as a group"),
                ({"op": "stop_rank", "rank": 99}, "stop_rank: there is no rank 99 in this run"),
                ({"op": "restart_rank", "rank": 99},
                 "restart_rank: there is no rank 99 in this run"),
                ({"op": "checkpoint"}, "checkpoint: no --checkpoint-dir was given"),
            ]:
                send(frame(order))
                assert _last(watcher) == f"{DROPPED}{why} (dashboard pid {os.getpid()})"
            send(b"[" * 30_000 + b"]" * 30_000 + b"\n")  # parsed, it would recurse past the stack
            assert _last(watcher).startswith(f"{DROPPED}not a JSON object")

            @settings(max_examples=60, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(bad_orders())
            def fuzz(line: bytes) -> None:
                send(line)

            fuzz()
            # The rest are summed up once their window is over.
            deadline = time.monotonic() + 60
            while _dropped(watcher) + _summed(viewer_lines(watcher)) < sent:
                assert time.monotonic() < deadline, viewer_lines(watcher)[-3:]
                time.sleep(0.1)
        # The run took none of it: it trains on with both ranks, as it was set up.
        step = events(log, "step")[-1]["global_step"]
        wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step + 5, 60)
        assert not [e for e in events(log, "rank") if e.get("state") in ("stopped", "crashed")]
        assert not [e for e in events(log, "settings") if e.get("status") == "requested"]
        texts = [e["text"] for e in events(log, "message")]
        logged = [t for t in texts if t.startswith(DROPPED[9:])]
        assert len(logged) + _summed(texts) == sent == _dropped(watcher) + \
            _summed(viewer_lines(watcher))
        assert psutil.Process(pid).num_threads() <= threads + 2  # its one connection's, at most
    finally:
        os.kill(pid, signal.SIGTERM)
        assert_gone(pids, timeout=60)


@pytest.mark.timeout(300)
def test_dashboards_past_64_are_refused_and_the_run_stays_bounded(env, tmp_path):
    """100 connections that never read: 64 are served, the rest refused with a line each; the
    run's threads stay bounded (two a dashboard), and it trains on."""
    log = tmp_path / "many.jsonl"
    pid, path = detached(env, log)
    pids = run_pids(log) | {pid}
    host = psutil.Process(pid)
    before = host.num_threads()
    conns = []
    try:
        for _ in range(100):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            conns.append(s)
        refused = lambda: [e for e in events(log, "message")  # noqa: E731
                           if e["text"].endswith(f"{MAX_VIEWERS} dashboards are attached already")]
        deadline = time.monotonic() + 60
        while len(refused()) < 100 - MAX_VIEWERS:
            assert time.monotonic() < deadline, len(refused())
            time.sleep(0.1)
        assert len(refused()) == 100 - MAX_VIEWERS
        assert host.num_threads() <= before + 2 * MAX_VIEWERS
        step = events(log, "step")[-1]["global_step"]
        wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step + 5, 60)
    finally:
        for s in conns:
            s.close()
    # Closed, they leave: a new dashboard is served again.
    deadline = time.monotonic() + 30
    while host.num_threads() > before + 2:
        assert time.monotonic() < deadline, host.num_threads()
        time.sleep(0.1)
    viewer = connect(path)
    viewer.close()
    os.kill(pid, signal.SIGTERM)
    assert_gone(pids, timeout=60)


def test_a_dashboard_that_falls_behind_is_dropped_with_a_line(tmp_path):
    """It never reads while the run's state changes: once MAX_BEHIND bytes wait for it, it is
    dropped with a line, and what it cost the run is freed (the run itself is not started: its
    state's changes are what the host serves)."""
    sup = Supervisor(run_config(*TINY), str(tmp_path / "behind.jsonl"))
    sup.done.set()  # no run thread: its notes go straight to the screens
    host = RunHost(sup, RuntimeDir(str(tmp_path / "rt")), "1.sock", "behind")
    host.start()
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(host.folder.inside("1.sock"))
            deadline = time.monotonic() + 30
            while not host.watched():
                assert time.monotonic() < deadline, "never served"
                time.sleep(0.01)
            line, said = "x" * 1000, 0
            while host.watched():  # until it is dropped: the screens keep the last lines only
                assert said < 2 * MAX_BEHIND // len(line), "never dropped"
                sup.state.say(line)
                said += 1
            assert said > MAX_BEHIND // (2 * len(line))  # it was served until far behind
            dropped = lambda: [text for _seq, _t, _level, text, _kind  # noqa: E731
                               in sup.state.lines_after(0) if text.startswith("dropped")]
            deadline = time.monotonic() + 30
            while not dropped():
                assert time.monotonic() < deadline, "never dropped"
                time.sleep(0.05)
            assert dropped() == [f"dropped the dashboard of pid {os.getpid()}: it fell "
                               f"{MAX_BEHIND >> 20} MiB behind (it can attach again)"]
            assert not host.watched()
    finally:
        host.close()
