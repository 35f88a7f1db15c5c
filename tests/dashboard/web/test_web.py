"""`ddptui web`: a run's dashboard in browser tabs, its protocol without a browser (aiohttp's
test client): the token, then its cookie and the address bar without it, no framing, the Host
and the Origin, the cap on tabs, relative URLs (in a real browser: test_browser.py)."""

from __future__ import annotations

import socket
import sys

from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer

from ddptui.dashboard.web.server import WebServer


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
        # A wrong token beside a cookie that holds one: out of the address bar, nothing set.
        stale = await client.get("/?token=wrong", allow_redirects=False,
                                 cookies={"ddptui_view": view})
        assert stale.status == 303 and "Set-Cookie" not in stale.headers
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


def test_how_the_run_ended_is_said_as_ddptui_ls_says_it(tmp_path, monkeypatch):
    """A run whose log could not say its end (a full disk): its record says `failed`, and so
    does web's last line, where the log alone said `ended`."""
    import json
    import subprocess
    import time

    from ddptui.contract.runs.registry import RunRecord, runs
    from ddptui.contract.runs.runtime_dir import RuntimeDir
    from ddptui.dashboard.web.command import _ended

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "rt"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # a pid that ended
    started = time.time()
    record = RunRecord("r9", int(gone), "resnet18", 2, str(tmp_path / "r9.jsonl"), started,
                       state="failed", reason="its log cannot be written: No space left")
    with RuntimeDir() as folder:
        folder.write(f"r9.{gone}.json", json.dumps(record.__dict__).encode())
    assert [r.state for r in runs()] == ["failed"]  # what `ddptui ls` says
    assert _ended(RunRecord("r9", int(gone), "resnet18", 2, record.log, started)) == "failed"
