"""`ddptui web`: a run's dashboard in browser tabs. Its protocol without a browser (aiohttp's
test client: the token, the cookie, the Origin, the cap on tabs, relative URLs), then in a real
one (Debian's chromium, driven by playwright): the page draws the dashboard, a read-only tab's
key is refused by the run, a --control tab's key acts, each tab is one process."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from aiohttp.test_utils import TestClient, TestServer

from ddptui.dashboard.web.server import WebServer
from tests.helpers.runs import ROOT, assert_gone, detached, events, run_pids, wait_for_event

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.timeout(240)


def _server(max_viewers: int = 8, control: bool = True, alive: bool = True) -> WebServer:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return WebServer("r1", sock, max_viewers, control, lambda: alive, lambda: "done")


async def _client(server: WebServer) -> TestClient:
    client = TestClient(TestServer(await server._make_app()))
    await client.start_server()
    return client


async def test_every_request_needs_the_token_then_its_cookie():
    server = _server()
    client = await _client(server)
    try:
        view, control = server.tokens["view"], server.tokens["control"]
        for path in ("/", "/ws", "/ws-control", "/static/js/textual.js", "/download/x"):
            assert (await client.get(path)).status == 403, path
            assert (await client.get(path + "?token=wrong")).status == 403, path
        page = await client.get(f"/?token={view}")
        assert page.status == 200
        html = await page.text()
        cookie = page.cookies["ddptui_view"]
        assert cookie.value == view and cookie["httponly"] and cookie["samesite"] == "Strict"
        # Relative URLs only: a forwarded port or a proxy's path prefix works as it is.
        assert 'data-session-websocket-url="ws"' in html and 'src="static/js/textual.js"' in html
        assert "127.0.0.1" not in html
        assert (await client.get("/static/js/textual.js")).status == 200  # the cookie now
        page = await client.get(f"/?token={control}")
        assert 'data-session-websocket-url="ws-control"' in await page.text()
    finally:
        await client.close()


async def test_a_websocket_from_another_origin_or_beyond_its_role_is_refused():
    server = _server()
    client = await _client(server)
    try:
        await client.get(f"/?token={server.tokens['view']}")
        host = f"http://{client.host}:{client.port}"
        for origin in ("http://evil.example", "null", ""):
            r = await client.get("/ws", headers={"Origin": origin, "Connection": "Upgrade",
                                                  "Upgrade": "websocket"})
            assert r.status == 403 and "another origin" in await r.text(), origin
        r = await client.get("/ws-control", headers={"Origin": host})
        assert r.status == 403 and "may only watch" in await r.text()
    finally:
        await client.close()


async def test_past_max_viewers_a_tab_gets_a_page_saying_so():
    server = _server(max_viewers=1)
    server.viewers = 1  # one tab's process runs
    client = await _client(server)
    try:
        page = await client.get(f"/?token={server.tokens['view']}")
        assert page.status == 503 and "--max-viewers 1" in await page.text()
        r = await client.get("/ws", headers={"Origin": f"http://{client.host}:{client.port}"})
        assert r.status == 503
    finally:
        await client.close()


def test_without_control_there_is_one_token_and_bad_input_is_one_line(cli_main):
    assert set(_server(control=False).tokens) == {"view"}
    for args, said in [(["web", "--max-viewers", "0"], "--max-viewers must be at least 1"),
                       (["web", "--port", "70000"], "--port must be 0-65535, got 70000")]:
        code, err = cli_main(args)
        assert code == 2 and len(err) == 1 and said in err[0], err


def test_without_its_extra_ddptui_web_says_what_to_install(cli_main, monkeypatch):
    monkeypatch.setitem(sys.modules, "textual_serve.server", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "ddptui.dashboard.web.server")
    code, err = cli_main(["web"])
    assert code == 2 and err == ["ddptui: error: ddptui web needs its extra: pip install "
                                 "'ddptui[web]'"]


def _web(env, name: str, *args: str) -> tuple[subprocess.Popen, dict[str, str]]:
    """`ddptui web NAME --port 0 ARGS` started, and the URLs it printed, by role."""
    proc = subprocess.Popen([sys.executable, "-m", "ddptui", "web", name, "--port", "0", *args],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    urls = {}
    for line in proc.stdout:
        found = re.search(r"open (http://\S+) to (watch|steer)", line)
        if found:
            urls["view" if found[2] == "watch" else "control"] = found[1]
        if line.startswith("ddptui: from another machine: ssh -L "):
            return proc, urls
    raise AssertionError(f"ddptui web said: {proc.stderr.read()}")


# Every WebSocket message the page gets, as text: the terminal is a canvas, so whether the tab's
# dashboard has drawn is read from the bytes it was sent.
FRAMES = """
window.__frames = [];
const Real = window.WebSocket;
window.WebSocket = function (...args) {
  const ws = new Real(...args);
  ws.addEventListener("message", (m) => window.__frames.push(typeof m.data === "string"
    ? m.data : new TextDecoder("latin1").decode(new Uint8Array(m.data))));
  return ws;
};
"""


def _tab(browser, url: str):
    """A tab on `url` once its dashboard has drawn its first whole screen (its events pane)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.add_init_script(FRAMES)
    page.goto(url)
    page.wait_for_selector("body.-first-byte", timeout=120_000)  # textual-serve's first byte
    page.wait_for_function("window.__frames.some(f => f.includes('events'))", timeout=120_000)
    page.click(".xterm-screen")  # the terminal takes the keys
    return page


def _attaches(web: subprocess.Popen) -> list[psutil.Process]:
    """The tabs' attach processes that still run (an ended one is a zombie until reaped, and
    psutil will not read a zombie's command line)."""
    return [p for p in psutil.Process(web.pid).children(recursive=True) if _is_attach(p)]


def _is_attach(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE and "attach" in p.cmdline()
    except psutil.Error:  # gone, or become a zombie, between the two reads
        return False


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: apt-get install chromium")
def test_the_dashboard_in_a_real_browser_watches_or_steers_by_its_token(env, tmp_path):
    from playwright.sync_api import sync_playwright

    log = tmp_path / "web.jsonl"
    pid, _path = detached(env, log)
    pids = run_pids(log) | {pid}
    web, urls = _web(env, log.stem, "--control")
    pids.add(web.pid)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox"])
            page = _tab(browser, urls["view"])
            # A read-only tab: its key reaches the run, which refuses it with a line.
            page.keyboard.press("Space")
            refused = wait_for_event(log, lambda e: e["kind"] == "message" and
                                     "may only watch (read-only)" in e["text"], 60)
            assert refused["text"].startswith("a dashboard's message was dropped: pause: ")
            page.screenshot(path=str(tmp_path / "web.png"))  # kept with the test's files
            assert not [e for e in events(log, "run") if e["status"] in ("pausing", "paused")]
            # A --control tab steers: the same key pauses the run.
            steer = _tab(browser, urls["control"])
            assert len(_attaches(web)) == 2  # a process a tab
            steer.keyboard.press("Space")
            wait_for_event(log, lambda e: e["kind"] == "run" and e["status"] == "paused", 60)
            steer.close()
            deadline = time.monotonic() + 30
            while len(_attaches(web)) != 1:  # the closed tab's process ended
                assert time.monotonic() < deadline, _attaches(web)
                time.sleep(0.2)
            browser.close()
        os.kill(pid, signal.SIGTERM)  # the run ends: ddptui web says so and stops
        out, _err = web.communicate(timeout=60)
        assert web.returncode == 0 and f"ddptui: {log.stem} ended (interrupted): ddptui web " \
            "stops" in out
    finally:
        if web.poll() is None:
            web.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        assert_gone(pids, timeout=60)
