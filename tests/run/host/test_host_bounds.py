"""The bounds of a run's socket, whatever a dashboard sends: a flood of refused orders costs the
run's log a few lines (the rest summed up, the dashboard closed) while it trains on; an order
over 64 KiB is dropped with one line however it arrives; brackets inside a JSON string are text,
not nesting."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from ddptui.contract.socket.viewers import MAX_ORDER, frame
from tests.helpers.runs import assert_gone, detached, events, run_env, run_pids, wait_for_event

pytestmark = pytest.mark.timeout(300)

# A dashboard's process that may only watch and sends ORDERS pause orders as fast as the socket
# takes them, attaching again each time it is closed; then it prints how many it sent.
FLOOD = textwrap.dedent("""
    import socket, sys
    path, orders = sys.argv[1], int(sys.argv[2])
    line, sent = b'{"op":"pause"}\\n', 0
    while sent < orders:
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            try:
                s.sendall(b'{"op":"read_only"}\\n')
                while sent < orders:
                    n = min(4096, orders - sent)
                    s.sendall(line * n)
                    sent += n
            except OSError:
                pass  # closed for them: it attaches again
    print(sent)
""")


@pytest.fixture(scope="module")
def running(cache_dir, tmp_path_factory):
    """One run for the module's tests: its pid, socket and log."""
    env = run_env(cache_dir)
    log = tmp_path_factory.mktemp("bounds") / "bounds.jsonl"
    pid, path = detached(env, log)
    pids = run_pids(log) | {pid}
    yield pid, path, log
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    assert_gone(pids, timeout=60)


def _about(log, pid: int) -> list[str]:
    """The log's lines that name dashboard `pid`, as written."""
    with open(log, encoding="utf-8") as f:
        return [line for line in f if re.search(rf"\bpid {pid}\b", line)]


def _trains_on(log) -> None:
    step = events(log, "step")[-1]["global_step"]
    wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step + 2, 60)
    assert [e["status"] for e in events(log, "run")] == ["started"]  # never paused, never ended


def test_100000_refused_orders_cost_the_log_a_few_lines_and_the_run_trains_on(running):
    _pid, path, log = running
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, path, "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = flood.communicate(timeout=240)
    assert flood.returncode == 0 and out.strip() == "100000", err
    # Its window's sum comes once the window is over; then nothing more of it.
    summed = _said(log, f"more orders from dashboard pid {flood.pid} in the last ")
    lines = _about(log, flood.pid)
    texts = [json.loads(line)["text"] for line in lines]
    said = [t for t in texts if t == "a dashboard's message was dropped: pause: this dashboard "
            f"may only watch (read-only) (dashboard pid {flood.pid})"]
    closed = [t for t in texts if t.startswith(f"closed the dashboard of pid {flood.pid}: 100 of "
                                               "its orders were refused within 10 s")]
    assert len(said) == 10 and len(closed) == 1, texts
    assert re.fullmatch(rf"dropped [\d,]+ more orders from dashboard pid {flood.pid} in the last "
                        r"\d+ s", summed["text"])
    assert sum(len(line.encode()) for line in lines) < 4096, lines  # a few KB, of 1.6 MB sent
    _trains_on(log)


def _said(log, text: str) -> dict:
    return wait_for_event(log, lambda e: e["kind"] == "message" and text in e["text"], 60)


@pytest.mark.parametrize("writes", [1, 7])
def test_an_order_over_64_kib_is_dropped_with_one_line_however_it_arrives(running, writes):
    _pid, path, log = running
    said = f"closed the dashboard of pid {os.getpid()}: a message over {MAX_ORDER} bytes"
    before = len([line for line in _about(log, os.getpid()) if said in line])
    order = frame({"op": "pause", "pad": "x" * 100_000})  # acted on, were its size not checked
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        size = len(order) // writes + 1
        with contextlib.suppress(OSError):  # closed for it
            for i in range(0, len(order), size):
                s.sendall(order[i:i + size])
            while s.recv(1 << 20):  # its hello, then the end of the connection
                pass
    wait_for_event(log, lambda e: e["kind"] == "message" and
                   len([line for line in _about(log, os.getpid()) if said in line]) > before, 60)
    assert len([line for line in _about(log, os.getpid()) if said in line]) == before + 1
    _trains_on(log)


def test_brackets_inside_a_string_are_text_not_nesting(running):
    _pid, path, log = running
    request = "[[[[[[[[[{{{{"  # nine brackets and four braces: more than 8, all in a string
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(frame({"op": "settings", "settings": {"workers": 0}, "request": request}))
        # Taken: rank 0 echoes it, pending until the next epoch.
        taken = wait_for_event(log, lambda e: e["kind"] == "settings" and
                               e.get("request") == request, 60)
    assert taken["settings"]["workers"] == 0
    assert not [line for line in _about(log, os.getpid()) if "not a JSON object" in line]
