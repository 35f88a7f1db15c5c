"""The Unix socket between a run ddptui owns and the dashboards that watch it: where it lives,
who may use it, and the framing (a JSON object a line, bounded); what crosses it: dashboards.py.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import struct
from collections.abc import Iterator

from ddptui.contract.protocol.codec import encode, parse
from ddptui.contract.protocol.wire import Wire

MAX_ORDER = 1 << 16  # bytes of one viewer's message: an order is a few dozen
MAX_UPDATE = 1 << 26  # bytes of one message of the run's: its snapshot is the largest (~1 MB)
ORDER_NESTING = 8  # objects and arrays one order may hold one inside another: the deepest holds 2
WATCHING = ("stacks",)  # the orders a read-only dashboard gives: asking for stacks is watching
# A rank's stacks asked for again within this long are the ones on their way or just in: each
# answer is a message in the run's log, and no number of dashboards makes it write more often.
STACKS_FRESH_S = 5.0
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # a JSON string, escapes and all
_BRACKET = re.compile(rb"[][{}]")


class Refused(OSError):
    """The socket is not this user's own (owner or mode): nothing is sent to it."""


class TooLong(OSError):
    """A message over the bound: the connection it came on ends."""


def listen(path: str) -> socket.socket:
    """A listening socket at `path`, mode 0600 from its creation (no window where others may
    connect)."""
    if os.path.lexists(path):  # a run of this pid that was killed: its process is gone
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(8)
    return sock


def connect(path: str, timeout: float = 5.0) -> socket.socket:
    """Connect to a run's socket, after checking that this user owns it and no one else may
    use it (a socket of another user's could show a false run, or take our orders)."""
    info = os.stat(path)
    if not stat.S_ISSOCK(info.st_mode):
        raise Refused(f"{path} is not a socket")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Refused(f"{path} is not this user's own (owner {info.st_uid}, "
                      f"mode {oct(info.st_mode & 0o777)})")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        _pid, uid = peer(sock)
        if uid != os.getuid():  # the process that listens, whoever made the file
            raise Refused(f"{path} is served by user {uid}")
    except OSError:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def peer(sock: socket.socket) -> tuple[int, int]:
    """The process id and user id at the other end, as the kernel knows them."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def frame(message: Wire | dict) -> bytes:
    return encode(message).encode()


class Lines:
    """A socket's messages, one JSON object a line, in order until the peer closes (iterate); a
    line over `limit` bytes ends the connection (TooLong), however it arrived (one write or
    many), before it is parsed; one that is not an object is None, and so is one nested deeper
    than `nesting` objects and arrays (counted before parsing, outside strings)."""

    def __init__(self, sock: socket.socket, limit: int, nesting: int | None = None):
        self.sock, self.limit, self.nesting = sock, limit, nesting

    def __iter__(self) -> Iterator[dict | None]:
        buf = b""
        while True:
            while b"\n" not in buf:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return
                buf += chunk
                if len(buf) > self.limit and b"\n" not in buf:
                    raise TooLong(f"a message over {self.limit} bytes")
            *lines, buf = buf.split(b"\n")
            for line in lines:
                if len(line) > self.limit:
                    raise TooLong(f"a message over {self.limit} bytes")
                if line.strip():
                    yield _object(line, self.nesting)


def nesting(line: bytes) -> int:
    """How deep a JSON text's objects and arrays go, brackets inside its strings not counted."""
    brackets = _BRACKET.findall(_STRING.sub(b"", line))
    if len(brackets) <= 1:
        return len(brackets)
    deepest = depth = 0
    for b in brackets:
        depth += 1 if b in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _object(line: bytes, limit: int | None = None) -> dict | None:
    if limit is not None and line.count(b"{") + line.count(b"[") > limit and \
            nesting(line) > limit:
        return None
    return parse(line)

