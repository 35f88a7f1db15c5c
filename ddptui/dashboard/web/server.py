"""The web server of `ddptui web`: textual-serve's terminal client and process per tab, behind what
it lacks: a token (then a cookie) for every request, no framing, a Host and an Origin checked, a
cap on tabs, read-only tabs unless the control token came, and every tab's process ended with it.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

from ddptui.dashboard.web import checks
from ddptui.dashboard.web.tab import Tab, close
from ddptui.dashboard.web.tab_process import LEFT_S, WEB_TAB_ENV, end_children, kill, tabs_left

ROLES = ("view", "control")  # a tab that watches; one that steers as a terminal dashboard does
WS = {"view": "ws", "control": "ws-control"}  # each role's WebSocket, relative to the page
ALIVE_S = 1.0  # how often the run's process is looked for
TABS_END_S = 10.0  # for the tabs' processes to leave once told, before they are killed
_ROLE: contextvars.ContextVar[str] = contextvars.ContextVar("role", default="view")
_WATCH = web.AppKey("watch", asyncio.Task)  # the task that ends the server with the run


class WebServer(Server):
    """Serves the dashboard of run `name` on the listening `sock` (bound to `host`) until the run
    ends (`run_alive` turns false), Ctrl-C or SIGTERM; `ended` says how the run ended, as
    `ddptui ls` says it."""

    def __init__(self, name: str, sock: socket.socket, max_viewers: int, control: bool,
                 run_alive: Callable[[], bool], ended: Callable[[], str], host: str = "127.0.0.1"):
        address, port = sock.getsockname()[:2]
        super().__init__(command=name, host=address, port=port, title=f"ddptui · {name}",
                         templates_path=Path(__file__).parent / "templates")
        self.name, self.sock, self.max_viewers, self.served = name, sock, max_viewers, host
        self.run_alive, self.ended = run_alive, ended
        self.tokens = {role: secrets.token_urlsafe(24) for role in ROLES[:1 + control]}
        self.tabs: set[Tab] = set()  # tabs whose process runs now
        self.why_closed = "ddptui web stopped"  # what every open tab is told as it stops
        self.exit_code = 0

    @property
    def viewers(self) -> int:
        return len(self.tabs)

    # -- what each tab runs: one more dashboard of the run ---------------------------------------
    @property
    def command(self) -> str:
        """`ddptui attach NAME`, read-only but for a tab that came with the control token; it
        ends by itself once this server has gone (tab_process.py)."""
        args = [sys.executable, "-m", "ddptui", "attach", self.name]
        args = args if _ROLE.get() == "control" else [*args, "--read-only"]
        return f"{WEB_TAB_ENV}=1 exec {shlex.join(args)}"

    @command.setter
    def command(self, _value: str) -> None:
        pass  # fixed by the run's name and each tab's role

    # -- the guard every request passes ------------------------------------------------------------
    def _held(self, request: web.Request) -> set[str]:
        """The roles a request may act as: its URL's token, and the ones its cookies hold."""
        offered, held = request.query.get("token", ""), set()
        for role, token in self.tokens.items():
            if secrets.compare_digest(offered, token) or \
                    secrets.compare_digest(request.cookies.get(f"ddptui_{role}", ""), token):
                held.add(role)
        return held

    @web.middleware
    async def guard(self, request: web.Request, handler) -> web.StreamResponse:
        why = checks.wrong_host(request.headers.get("Host", ""), self.served)
        if why:
            raise web.HTTPForbidden(text=f"ddptui web: {why}\n")
        held = self._held(request)
        if not held:
            raise web.HTTPForbidden(text="ddptui web: open the URL with the token that "
                                         "`ddptui web` printed\n")
        last = request.path.rsplit("/", 1)[-1]
        if last in WS.values():
            why = checks.wrong_socket(request.headers.get("Origin", ""), request.host,
                                     last == WS["control"], "control" in held)
            if why:
                raise web.HTTPForbidden(text=f"ddptui web: {why}\n")
            _ROLE.set("control" if last == WS["control"] else "view")
        elif last == "":
            role = "control" if request.query.get("as") == "control" and "control" in held \
                else "view"
            offered = request.query.get("token")
            if offered is not None:  # the cookie now holds it: out of the address bar
                raise self._without_token(request, offered)
            _ROLE.set(role)
        return await handler(request)

    def _without_token(self, request: web.Request, offered: str) -> web.HTTPSeeOther:
        """The page again without its token (kept in a cookie, where it is one), the role named
        instead."""
        role = next((r for r, t in self.tokens.items() if secrets.compare_digest(offered, t)),
                    None)
        query = [(k, v) for k, v in request.query.items() if k not in ("token", "as")]
        query += [("as", "control")] if role == "control" else []
        redirect = web.HTTPSeeOther("./" + (f"?{urlencode(query)}" if query else ""))
        if role is not None:  # else a cookie let it in, and keeps its role
            redirect.set_cookie(f"ddptui_{role}", offered, httponly=True, samesite="Strict")
        return redirect

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.guard)
        app.on_response_prepare.append(checks.no_framing)
        app.router.add_get(f"/{WS['control']}", self.handle_websocket)
        return app

    # -- the page, with relative URLs only, and the tabs, counted ---------------------------------
    def _over_cap(self) -> str:
        return (f"{self.viewers} tabs watch {self.name} already (--max-viewers "
                f"{self.max_viewers}): close one, then reload")

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        if self.viewers >= self.max_viewers:
            response = aiohttp_jinja2.render_template("notice.html", request, {
                "title": f"ddptui · {self.name}", "text": self._over_cap(), "static": "static/"})
            response.set_status(503)
            return response
        return aiohttp_jinja2.render_template("page.html", request, {
            "title": self.title, "static": "static/", "websocket": WS[_ROLE.get()],
            "font_size": to_int(request.query.get("fontsize", "16"), 16)})

    async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
        tab = Tab(self.command, self.download_manager)
        if self.viewers >= self.max_viewers:  # two pages loaded at once: the later one is told
            await tab.ws.prepare(request)
            await close(tab.ws, self._over_cap())
            return tab.ws
        self.tabs.add(tab)
        try:
            return await tab.run(request, self.why_closed)
        finally:
            self.tabs.discard(tab)

    # -- its life: until the run ends, Ctrl-C or SIGTERM; its tabs' processes end with it ----------
    async def on_startup(self, app: web.Application) -> None:
        app[_WATCH] = asyncio.get_running_loop().create_task(self._watch_run())

    async def on_shutdown(self, app: web.Application) -> None:
        """Every tab is told why and its process to leave (as `d`: the run goes on); one that
        has not left by TABS_END_S is killed. Each is reaped while the loop runs, so that
        its pipes close in it."""
        app[_WATCH].cancel()
        await asyncio.gather(*(close(t.ws, self.why_closed) for t in list(self.tabs)),
                             return_exceptions=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TABS_END_S
        while (self.tabs or tabs_left(os.getpid())) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        kill(tabs_left(os.getpid()))
        while tabs_left(os.getpid()) and loop.time() < deadline + LEFT_S:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.1)  # the reaped processes' transports close on the loop

    async def _watch_run(self) -> None:
        while self.run_alive():
            await asyncio.sleep(ALIVE_S)
        ended = self.ended()
        self.why_closed = f"{self.name} ended ({ended}): ddptui web stopped"
        print(f"ddptui: {self.name} ended ({ended}): ddptui web stops", flush=True)
        asyncio.get_running_loop().call_soon(self.request_exit)

    def stop_with(self, code: int) -> None:
        """Ctrl-C (130) or SIGTERM (143): the tabs' processes end as the server closes."""
        self.exit_code = code
        self.why_closed = f"ddptui web stopped ({'Ctrl-C' if code == 130 else 'SIGTERM'})"
        self.request_exit()

    def serve(self) -> None:  # type: ignore[override]
        """On the socket ddptui bound (--port 0 is known before anything is served)."""
        checks.quiet_logs()
        loop = asyncio.new_event_loop()
        loop.add_signal_handler(signal.SIGINT, self.stop_with, 130)
        loop.add_signal_handler(signal.SIGTERM, self.stop_with, 143)
        try:
            web.run_app(self._make_app(), sock=self.sock, handle_signals=False, loop=loop,
                        print=lambda *args: None, access_log=None)
        finally:
            end_children(os.getpid())

