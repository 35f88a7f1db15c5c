"""One browser tab of `ddptui web`, in the server: its WebSocket, every message the page sends
checked before it reaches the tab's process (textual-serve's AppService), and a reason when it closes.
"""

from __future__ import annotations

from aiohttp import WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.download_manager import DownloadManager

from ddptui.contract.protocol.codec import json_value

MAX_MESSAGE = 1 << 16  # bytes of one message from the page: a key, a paste, a size
MAX_CELLS = 2000  # columns or rows a page may ask for
REASON_BYTES = 123  # what a WebSocket's close frame may carry
FIRST_SCREEN = 1024  # bytes of a write that draws a screen (the driver's mode switches: a few)


def size(width: object, height: object) -> tuple[int, int] | None:
    """A terminal size the page asked for, if it is one."""
    if all(type(v) is int and 1 <= v <= MAX_CELLS for v in (width, height)):
        return int(width), int(height)  # type: ignore[call-overload]
    return None


def envelope(text: str) -> tuple[str, object] | None:
    """A page's message, ["type", payload], as textual.js sends it; None for anything else."""
    message = json_value(text)
    if not isinstance(message, list) or not 1 <= len(message) <= 2 or \
            not isinstance(message[0], str):
        return None
    return message[0], message[1] if len(message) == 2 else None


async def close(ws: web.WebSocketResponse, reason: str) -> None:
    """Close the tab's WebSocket saying why; the page shows it."""
    said = reason.encode()[:REASON_BYTES].decode(errors="ignore")
    await ws.close(message=said.encode())


class Tab:
    """A tab's WebSocket and its process (`command`), from its start to its close."""

    def __init__(self, command: str, downloads: DownloadManager):
        self.command, self.downloads = command, downloads
        self.ws = web.WebSocketResponse(heartbeat=15, max_msg_size=MAX_MESSAGE)
        self.service: AppService | None = None
        self._shown = False  # its process drew its first screen

    async def run(self, request: web.Request, ended: str) -> web.WebSocketResponse:
        """Until the page or the tab's process goes; `ended` says why, where the process did."""
        await self.ws.prepare(request)
        width, height = size(_int(request.query.get("width")), _int(request.query.get("height"))) \
            or (80, 24)
        self.service = AppService(self.command, write_bytes=self._draw,
                                  write_str=self.ws.send_str, close=self._gone,
                                  download_manager=self.downloads)
        await self.service.start(width, height)
        try:
            async for message in self.ws:
                if message.type == WSMsgType.TEXT:
                    await self._take(message.data)
        finally:
            await self.service.stop()
        if not self.ws.closed:
            await close(self.ws, ended)
        return self.ws

    async def _draw(self, data: bytes) -> None:
        await self.ws.send_bytes(data)
        if not self._shown and len(data) > FIRST_SCREEN and self.service is not None:
            # Textual's web driver starts blurred, and a blurred app draws no footer: the page
            # is the tab's whole window, so it has the focus from its first screen on.
            self._shown = True
            await self.service.focus()

    async def _gone(self) -> None:
        """The tab's process said it exits (q, d): the page is told so."""
        await close(self.ws, "the dashboard was closed in this tab (q or d): reload to open it "
                             "again")

    async def _take(self, text: str) -> None:
        found = envelope(text)
        if found is None or self.service is None:
            return  # not what the page sends: dropped, nothing said (it costs nothing)
        kind, payload = found
        if kind == "stdin" and isinstance(payload, str):
            await self.service.send_bytes(payload.encode("utf-8", "replace"))
        elif kind == "resize" and isinstance(payload, dict):
            cells = size(payload.get("width"), payload.get("height"))
            if cells:
                await self.service.set_terminal_size(*cells)
        elif kind == "ping" and isinstance(payload, str) and len(payload) <= 32:
            await self.ws.send_json(["pong", payload])
        elif kind == "focus":
            await self.service.focus()
        elif kind == "blur":
            await self.service.blur()


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
