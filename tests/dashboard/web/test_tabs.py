"""Every tab's process ends with `ddptui web`, however it ends (Ctrl-C, SIGTERM, SIGKILL; the
run's end: test_browser.py), and the run goes on; what reaches the server from outside (a
header over 8 KB, a tab's garbage messages) prints no traceback. Tabs here are bare WebSockets,
each starting the process a browser's tab would."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from urllib.parse import urlsplit

import aiohttp
import pytest

from tests.helpers.runs import assert_gone, detached, events, run_env, run_pids, wait_for_event
from tests.helpers.web import attaches, bare_tab, start_web

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def running(cache_dir, tmp_path_factory):
    """One run for the module's tests: each starts its own `ddptui web` on it."""
    env = run_env(cache_dir)
    log = tmp_path_factory.mktemp("tabs") / "tabs.jsonl"
    pid, _path = detached(env, log)
    pids = run_pids(log) | {pid}
    yield env, log
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    assert_gone(pids, timeout=60)


GARBAGE = ["garbage", "[]", "[1]", "{}", '["stdin"]', '["stdin", 7]', '["resize", "x"]',
           '["resize", {"width": "a", "height": 3}]', '["resize", {"width": 1e9, "height": -1}]',
           '["ping", {"a": 1}]', "[" * 10_000 + "]" * 10_000, '["nope", 1]', "\x00\xff"]


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err
    assert all(line.startswith("ddptui web: ") for line in err.splitlines()), err


def _header_over_8k(url: str) -> None:
    """A request whose header is over aiohttp's 8 KB bound, from a process with no token."""
    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        assert s.recv(100).split(b"\r\n")[0].endswith(b" 400 Bad Request")


@pytest.mark.parametrize("way", ["SIGINT", "SIGTERM", "SIGKILL"])
async def test_every_tabs_process_ends_with_ddptui_web_and_the_run_goes_on(running, way):
    env, log = running
    web, urls = start_web(env, log.stem, "--control")
    try:
        async with aiohttp.ClientSession() as session:
            watch = await bare_tab(session, urls["view"])
            steer = await bare_tab(session, urls["control"], "ws-control")
            tabs = {p.pid for p in attaches(web)}
            assert len(tabs) == 2 and not watch.closed  # a process a tab
            if way == "SIGTERM":  # what reaches it from outside is checked, and said in a line
                for text in GARBAGE:
                    await steer.send_str(text)
                await steer.send_bytes(b"\x00" * 100)
                _header_over_8k(urls["view"])
            web.send_signal(getattr(signal, way))
            _out, err = web.communicate(timeout=120)
        assert web.returncode == {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}[way]
        _no_traceback(err)
        assert_gone(tabs, timeout=60)  # told to leave; or, web killed, they saw its pipe close
        # Leaving, a --control tab did not end the run: it trains on.
        step = events(log, "step")[-1]["global_step"]
        wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step + 2, 60)
        assert [e["status"] for e in events(log, "run")] == ["started"]
    finally:
        if web.poll() is None:
            web.kill()
            web.wait()
