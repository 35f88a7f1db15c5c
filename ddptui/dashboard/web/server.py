"""The web server of `ddptui web`: textual-serve's page, terminal client and process per tab,
behind what it lacks: a token for every request, the WebSocket's Origin checked against its
Host, relative URLs (a forwarded port or a proxy path works), a cap on tabs, and read-only tabs
unless a tab came with the control token.
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
import shlex
import socket
import sys
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

ROLES = ("view", "control")  # a tab that watches; one that steers as a terminal dashboard does
WS = {"view": "ws", "control": "ws-control"}  # each role's WebSocket, relative to the page
ALIVE_S = 1.0  # how often the run's process is looked for
_ROLE: contextvars.ContextVar[str] = contextvars.ContextVar("role", default="view")
_WATCH = web.AppKey("watch", asyncio.Task)  # the task that ends the server with the run


class WebServer(Server):
    """Serves the dashboard of run `name` on the listening `sock` until the run ends
    (`run_alive` turns false), Ctrl-C or SIGTERM; `ended` says how the run ended, for the line
    printed then."""

    def __init__(self, name: str, sock: socket.socket, max_viewers: int, control: bool,
                 run_alive: Callable[[], bool], ended: Callable[[], str]):
        host, port = sock.getsockname()[:2]
        super().__init__(command=name, host=host, port=port, title=f"ddptui · {name}")
        self.name, self.sock, self.max_viewers = name, sock, max_viewers
        self.run_alive, self.ended = run_alive, ended
        self.tokens = {role: secrets.token_urlsafe(24) for role in ROLES[:1 + control]}
        self.viewers = 0  # tabs whose process runs now
        self.exit_code = 0

    # -- what each tab runs: one more dashboard of the run ---------------------------------------
    @property
    def command(self) -> str:
        """`ddptui attach NAME`, read-only but for a tab that came with the control token."""
        args = [sys.executable, "-m", "ddptui", "attach", self.name]
        return shlex.join(args if _ROLE.get() == "control" else [*args, "--read-only"])

    @command.setter
    def command(self, _value: str) -> None:
        pass  # fixed by the run's name and each tab's role

    # -- the guard every request passes ------------------------------------------------------------
    def _role(self, request: web.Request) -> str | None:
        """The role a request may act as: the URL's token, else the one its cookie holds."""
        offered = request.query.get("token")
        for role, token in self.tokens.items():
            if offered is not None and secrets.compare_digest(offered, token):
                return role
        held = [role for role, token in self.tokens.items()
                if secrets.compare_digest(request.cookies.get(f"ddptui_{role}", ""), token)]
        return "control" if "control" in held else (held[0] if held else None)

    @web.middleware
    async def guard(self, request: web.Request, handler) -> web.StreamResponse:
        role = self._role(request)
        if role is None:
            raise web.HTTPForbidden(text="ddptui web: open the URL with the token that "
                                         "`ddptui web` printed\n")
        if request.path.rsplit("/", 1)[-1] in WS.values():
            origin = request.headers.get("Origin", "")
            if urlsplit(origin).netloc != request.host:  # another site's page in this browser
                raise web.HTTPForbidden(text="ddptui web: a WebSocket from another origin\n")
            if request.path.endswith(WS["control"]) and role != "control":
                raise web.HTTPForbidden(text="ddptui web: this tab may only watch\n")
            role = "control" if request.path.endswith(WS["control"]) else "view"
        _ROLE.set(role)
        response = await handler(request)
        offered = request.query.get("token")
        if offered is not None and offered == self.tokens.get(role) and not response.prepared:
            response.set_cookie(f"ddptui_{role}", offered, httponly=True, samesite="Strict")
        return response

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self.guard)
        app.router.add_get(f"/{WS['control']}", self.handle_websocket)
        return app

    # -- the page, with relative URLs only, and the tabs, counted ---------------------------------
    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        if self.viewers >= self.max_viewers:
            return web.Response(status=503, content_type="text/html", text=(
                f"<p>ddptui web: {self.viewers} tabs watch {self.name} already "
                f"(--max-viewers {self.max_viewers}). Close one, then reload this page.</p>"))
        return aiohttp_jinja2.render_template("app_index.html", request, {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": WS[_ROLE.get()],
            "config": {"static": {"url": "static/"}},
            "application": {"name": self.title},
        })

    async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
        if self.viewers >= self.max_viewers:
            raise web.HTTPServiceUnavailable(text="ddptui web: --max-viewers tabs are open\n")
        self.viewers += 1
        try:
            return await super().handle_websocket(request)
        finally:
            self.viewers -= 1

    # -- its life: until the run ends, Ctrl-C or SIGTERM -------------------------------------------
    async def on_startup(self, app: web.Application) -> None:
        app[_WATCH] = asyncio.get_running_loop().create_task(self._watch_run())

    async def on_shutdown(self, app: web.Application) -> None:
        app[_WATCH].cancel()

    async def _watch_run(self) -> None:
        while self.run_alive():
            await asyncio.sleep(ALIVE_S)
        print(f"ddptui: {self.name} ended ({self.ended()}): ddptui web stops", flush=True)
        asyncio.get_running_loop().call_soon(self.request_exit)

    def stop_with(self, code: int) -> None:
        """Ctrl-C (130) or SIGTERM (143): the tabs' processes end as the server closes."""
        self.exit_code = code
        self.request_exit()

    def serve(self) -> None:  # type: ignore[override]
        """On the socket ddptui bound (--port 0 is known before anything is served)."""
        import signal

        loop = asyncio.new_event_loop()
        loop.add_signal_handler(signal.SIGINT, self.stop_with, 130)
        loop.add_signal_handler(signal.SIGTERM, self.stop_with, 143)
        web.run_app(self._make_app(), sock=self.sock, handle_signals=False, loop=loop,
                    print=lambda *args: None)
