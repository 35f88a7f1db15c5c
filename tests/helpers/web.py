"""`ddptui web` as a user starts it, and its tabs: in Debian's chromium (playwright) or as a bare
WebSocket (a tab's process without a browser); the tabs' processes, read from the server's."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys

import aiohttp
import psutil

from tests.helpers.runs import ROOT

CHROMIUM = shutil.which("chromium")

# Every WebSocket message the page gets, as text: the terminal is a canvas, so what the tab's
# dashboard drew is read from the bytes it was sent.
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


def start_web(env, name: str, *args: str) -> tuple[subprocess.Popen, dict[str, str]]:
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


def open_tab(browser, url: str, requests: list[str] | None = None):
    """A tab on `url` once its dashboard has drawn its first whole screen (its events pane);
    `requests` gets the URL of every request the page makes."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.add_init_script(FRAMES)
    if requests is not None:
        page.on("request", lambda r: requests.append(r.url))
        page.on("websocket", lambda ws: requests.append(ws.url))
    page.goto(url)
    page.wait_for_selector("body.-first-byte", timeout=120_000)  # textual-serve's first byte
    drawn(page, "events")
    return page


def drawn(page, text: str, after: int = 0) -> None:
    """Until the page was sent `text` (in its messages from number `after` on)."""
    page.wait_for_function(f"window.__frames.slice({after}).some(f => f.includes({text!r}))",
                           timeout=120_000)


async def bare_tab(session: aiohttp.ClientSession, url: str,
                   socket: str = "ws") -> aiohttp.ClientWebSocketResponse:
    """A tab's WebSocket (`socket`: ws-control steers) opened as its page would (its Origin,
    the URL's token), once its dashboard has drawn its first whole screen: a tab's process
    without a browser."""
    base, token = url.split("/?token=")
    ws = await session.ws_connect(f"{base}/{socket}?token={token}&width=120&height=40",
                                  origin=base)
    seen = b""
    while b"events" not in seen:
        message = await ws.receive(timeout=120)
        assert message.type == aiohttp.WSMsgType.BINARY, message
        seen = seen[-16:] + message.data
    return ws


def attaches(web: subprocess.Popen) -> list[psutil.Process]:
    """The tabs' attach processes that still run (an ended one is a zombie until reaped, and
    psutil will not read a zombie's command line)."""
    return [p for p in psutil.Process(web.pid).children(recursive=True) if _is_attach(p)]


def _is_attach(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE and "attach" in p.cmdline()
    except psutil.Error:  # gone, or become a zombie, between the two reads
        return False


async def until(predicate, timeout: float = 60) -> None:
    """Until `predicate()` holds; the timeout only keeps a failure from hanging the suite."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "never"
        await asyncio.sleep(0.1)
