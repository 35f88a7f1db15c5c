"""What `ddptui web` checks of every request before it acts (its Host, a WebSocket's Origin), what
it adds to every response (no framing), and what it prints of an error it meets: one line.
"""

from __future__ import annotations

import ipaddress
import logging
from urllib.parse import urlsplit

from aiohttp import web

# On every response: no page of another origin may frame a tab (a framed --control tab took a
# click and a key), and no request the page makes names the page it came from.
EVERY_RESPONSE = {"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY",
                  "Referrer-Policy": "no-referrer"}


def wrong_host(host: str, served: str) -> str | None:
    """Why a request's Host cannot be this server's, or None: a name must be the one it serves
    on (or localhost), since a page of another name that resolves here (DNS rebinding) is
    another site; an address is whatever forwarded port reached it."""
    name = (urlsplit(f"//{host}").hostname or "") if host else ""
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        pass
    if name and name in ("localhost", served.lower()):
        return None
    shown = repr(host[:60]) if host else "none"
    return f"a request for another host (Host: {shown}): open the URL that `ddptui web` printed"


def wrong_socket(origin: str, host: str, control_socket: bool, may_control: bool) -> str | None:
    """Why a tab's WebSocket may not open, or None: it comes from the page's own origin (not
    another site's page in this browser), and a steering one with the control token."""
    if urlsplit(origin).netloc != host:
        return "a WebSocket from another origin"
    if control_socket and not may_control:
        return "this tab may only watch"
    return None


async def no_framing(_request: web.Request, response: web.StreamResponse) -> None:
    """On every response, the token's 403 and the WebSocket's handshake too."""
    response.headers.update(EVERY_RESPONSE)


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        error = record.exc_info[1] if record.exc_info else None
        text = record.getMessage() + (f": {type(error).__name__}: {error}" if error else "")
        return "ddptui web: " + " ".join(text.split())[:200]


def quiet_logs() -> None:
    """aiohttp's and textual-serve's errors (a header over 8 KB, a tab's process that failed) as
    one line each on stderr, never a traceback: whoever can reach the port can cause them."""
    handler = logging.StreamHandler()
    handler.setFormatter(_OneLine())
    for name in ("aiohttp", "textual-serve"):
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate = [handler], False
        logger.setLevel(logging.WARNING)
