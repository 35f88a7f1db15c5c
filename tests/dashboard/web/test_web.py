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
from aiohttp import WSMsgType
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


async def test_every_request_needs_the_token_then_its_cookie_and_the_address_bar_drops_it():
    server = _server()
    client = await _client(server)
    try:
        view, control = server.tokens["view"], server.tokens["control"]
        for path in ("/", "/ws", "/ws-control", "/static/js/textual.js", "/download/x"):
            assert (await client.get(path)).status == 403, path
            assert (await client.get(path + "?token=wrong")).status == 403, path
        # The token becomes a cookie, and the page is loaded again without it (history, the
        # address bar and anyone looking over a shoulder see no token).
        first = await client.get(f"/?token={view}&fontsize=14", allow_redirects=False)
        assert first.status == 303 and first.headers["Location"] == "./?fontsize=14"
        cookie = first.cookies["ddptui_view"]
        assert cookie.value == view and cookie["httponly"] and cookie["samesite"] == "Strict"
        page = await client.get("/?fontsize=14", cookies={"ddptui_view": view})
        assert page.status == 200
        html = await page.text()
        # Relative URLs only: a forwarded port or a proxy's path prefix works as it is; and
        # nothing is asked of another host (the font is served with the page).
        assert 'data-session-websocket-url="ws"' in html and 'src="static/js/textual.js"' in html
        assert "127.0.0.1" not in html and "://" not in html
        font = await client.get("/static/fonts/RobotoMono-VariableFont_wght.ttf",
                                cookies={"ddptui_view": view})
        assert font.status == 200
        steer = await client.get(f"/?token={control}", allow_redirects=False)
        assert steer.headers["Location"] == "./?as=control"
        page = await client.get("/?as=control", cookies={"ddptui_control": control})
        assert 'data-session-websocket-url="ws-control"' in await page.text()
        # The control URL asked for with the view token alone watches.
        client.session.cookie_jar.clear()
        page = await client.get("/?as=control", cookies={"ddptui_view": view})
        assert 'data-session-websocket-url="ws"' in await page.text()
    finally:
        await client.close()


async def test_no_response_may_be_framed_and_a_host_name_must_be_the_one_served():
    server = _server()
    client = await _client(server)
    try:
        view = server.tokens["view"]
        for path in ("/", f"/?token={view}", "/static/js/textual.js", "/ws"):
            r = await client.get(path, allow_redirects=False)
            assert r.headers["Content-Security-Policy"] == "frame-ancestors 'none'", path
            assert r.headers["X-Frame-Options"] == "DENY", path
        # DNS rebinding: a name of another site's that resolves to 127.0.0.1 is refused, token
        # or not; an address (a forwarded port) and localhost are this machine.
        for host, status in [("evil.example", 403), (f"evil.example:{client.port}", 403),
                             ("localhost:9000", 303), ("127.0.0.1:9000", 303), ("[::1]", 303)]:
            r = await client.get(f"/?token={view}", headers={"Host": host}, allow_redirects=False)
            assert r.status == status, host
        r = await client.get(f"/?token={view}", headers={"Host": "evil.example"})
        assert "a request for another host" in await r.text()
    finally:
        await client.close()


async def test_a_websocket_from_another_origin_or_beyond_its_role_is_refused():
    server = _server()
    client = await _client(server)
    try:
        cookies = {"ddptui_view": server.tokens["view"]}
        host = f"http://{client.host}:{client.port}"
        for origin in ("http://evil.example", "null", ""):
            r = await client.get("/ws", cookies=cookies, headers={
                "Origin": origin, "Connection": "Upgrade", "Upgrade": "websocket"})
            assert r.status == 403 and "another origin" in await r.text(), origin
        r = await client.get("/ws-control", cookies=cookies, headers={"Origin": host})
        assert r.status == 403 and "may only watch" in await r.text()
    finally:
        await client.close()


async def test_past_max_viewers_a_tab_gets_a_page_saying_so_in_the_dashboards_style():
    server = _server(max_viewers=1)
    server.tabs.add(object())  # one tab's process runs
    client = await _client(server)
    try:
        cookies = {"ddptui_view": server.tokens["view"]}
        page = await client.get("/", cookies=cookies)
        html = await page.text()
        assert page.status == 503 and "1 tabs watch r1 already (--max-viewers 1): close one, " \
            "then reload" in html and 'class="box"' in html
        # A page loaded before the cap was reached: its WebSocket is told why as it closes.
        ws = await client.ws_connect(f"/ws?token={server.tokens['view']}",
                                     origin=f"http://{client.host}:{client.port}")
        closing = await ws.receive()
        assert closing.type == WSMsgType.CLOSE and "--max-viewers 1" in closing.extra
    finally:
        server.tabs.clear()
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
