"""`ddptui web` in a real browser (Debian's chromium, driven by playwright): a tab draws the whole
dashboard, footer too, before any click, asks nothing of another host and drops its token from
the address bar; a read-only tab watches (stacks, the GPU screen, help) and its steering keys say
why they cannot act, while a --control tab steers; the run's end ends web and every tab's
process, and the page says why; a page of another local port cannot frame a tab."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import signal
import threading
from urllib.parse import urlsplit

import pytest

from tests.helpers.runs import assert_gone, detached, events, run_pids, wait_for_event
from tests.helpers.web import CHROMIUM, attaches, drawn, open_tab, start_web

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium: apt-get install chromium")]


def _chromium(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])


def _frames(page) -> int:
    return page.evaluate("window.__frames.length")


def _press(page, key: str, shows: str) -> None:
    """`key` pressed in the tab, and the screen it drew: `shows` in what the page was sent."""
    seen = _frames(page)
    page.keyboard.press(key)
    drawn(page, shows, seen)


def test_the_dashboard_in_a_real_browser_watches_or_steers_by_its_token(env, tmp_path):
    from playwright.sync_api import sync_playwright

    log = tmp_path / "web.jsonl"
    pid, _path = detached(env, log)
    pids = run_pids(log) | {pid}
    web, urls = start_web(env, log.stem, "--control")
    pids.add(web.pid)
    requests: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = _chromium(pw)
            page = open_tab(browser, urls["view"], requests)
            assert "token" not in page.url  # in a cookie now, not in the history
            drawn(page, "GPU detail")  # the footer, with the first screen: nothing clicked yet
            page.click(".xterm-screen")  # the terminal takes the keys
            # Read-only: a steering key says why it cannot act, and sends the run nothing.
            _press(page, "Space", "may only watch (read-only)")
            page.screenshot(path=str(tmp_path / "web.png"))  # kept with the test's files
            # Each screen is closed by its own key: an escape followed at once by a key reads as
            # alt and that key.
            _press(page, "?", "cannot act here")  # the help says it of every steering key
            page.keyboard.press("?")
            # Watching is not steering: a rank's stacks, the GPU screen.
            _press(page, "t", "most recent call first")
            page.keyboard.press("t")
            _press(page, "g", "GPUs of the run")
            page.keyboard.press("g")
            # A --control tab steers: the same key pauses the run.
            steer = open_tab(browser, urls["control"], requests)
            assert len(attaches(web)) == 2  # a process a tab
            assert not [e for e in events(log, "run") if e["status"] in ("pausing", "paused")]
            steer.click(".xterm-screen")
            steer.keyboard.press("Space")
            wait_for_event(log, lambda e: e["kind"] == "run" and e["status"] == "paused", 60)
            # Nothing asked of a host other than the one served (fonts included).
            assert {urlsplit(u).hostname for u in requests} == {"127.0.0.1"}, requests
            assert not [e for e in events(log, "message") if "dashboard pid" in e["text"]]
            # The run ends: web says so as `ddptui ls` would, stops, and so does every tab's
            # process; each page says why.
            tabs = {p.pid for p in attaches(web)}
            os.kill(pid, signal.SIGTERM)
            out, err = web.communicate(timeout=60)
            assert web.returncode == 0 and f"ddptui: {log.stem} ended (interrupted): ddptui " \
                "web stops" in out and "Traceback" not in err
            assert_gone(tabs, timeout=60)
            page.wait_for_selector("body.-closed", timeout=60_000)
            assert page.text_content("#why") == f"{log.stem} ended (interrupted): ddptui web " \
                "stopped"
            browser.close()
    finally:
        if web.poll() is None:
            web.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        assert_gone(pids, timeout=60)


def test_a_page_of_another_local_port_cannot_frame_a_tab(env, tmp_path):
    from playwright.sync_api import sync_playwright

    log = tmp_path / "framed.jsonl"
    pid, _path = detached(env, log)
    pids = run_pids(log) | {pid}
    web, urls = start_web(env, log.stem, "--control")
    pids.add(web.pid)
    # Another local user's page: the --control tab in an invisible frame.
    (tmp_path / "index.html").write_text(f'<iframe id="f" src="{urls["control"]}" width="1400" '
                                         'height="900" style="opacity: 0"></iframe>')
    serve = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    other = http.server.HTTPServer(("127.0.0.1", 0), serve)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = _chromium(pw)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"http://127.0.0.1:{other.server_port}/")  # the frame has loaded too
            frame = page.frame_locator("#f")
            assert frame.locator("#terminal").count() == 0  # the browser refused to show it
            page.mouse.click(700, 450)  # a click and a key into the frame reach nothing
            page.keyboard.press("Space")
            # A tab of the user's own opens meanwhile; the frame never got a process.
            open_tab(browser, urls["view"])
            assert len(attaches(web)) == 1
            browser.close()
        assert not [e for e in events(log, "run") if e["status"] in ("pausing", "paused")]
    finally:
        other.shutdown()
        web.terminate()
        web.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        assert_gone(pids, timeout=60)
