"""The socket between ranks launched elsewhere (torchrun, srun) and `ddptui attach`: the shared
key, the handshake (HMAC challenge both ways), and size-capped JSON messages. No pickle crosses it.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import struct
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from ddptui.contract.protocol.codec import encode, message_of
from ddptui.contract.protocol.events import Event
from ddptui.contract.protocol.orders import Order

KEY_ENV = "DDPTUI_AUTHKEY"
KEY_FILE_ENV = "DDPTUI_AUTHKEY_FILE"
MAX_MESSAGE = 1 << 20  # bytes; a longer message drops the connection
# Each step of a handshake (connect, challenge, answer) gets this long on either side: a peer
# that accepted and went quiet (a listener that dropped it, a port scanner) costs a retry, never
# a thread for ever.
HANDSHAKE_S = 10.0
# A send that cannot finish this long has no reader: the link reconnects (a dashboard that is
# merely behind reads far faster than this).
SEND_S = 60.0


class MessageTooLong(OSError):
    """A peer sent more than MAX_MESSAGE bytes at once: the connection is dropped."""


class NoKey(ValueError):
    """No usable key: the message says where one comes from."""


def default_key_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "ddptui", "authkey")


def load_key(create: bool = False) -> tuple[bytes, str]:
    """(key, where it came from): $DDPTUI_AUTHKEY, else the key file ($DDPTUI_AUTHKEY_FILE or
    ~/.config/ddptui/authkey), which `create` makes with a fresh random key, mode 0600."""
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV].encode(), f"${KEY_ENV}"
    path = os.environ.get(KEY_FILE_ENV) or default_key_path()
    if not os.path.exists(path):
        if not create:
            raise NoKey(f"no key for the dashboard link: set {KEY_ENV}, or copy the key file "
                            f"`ddptui attach` printed to {path}")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise NoKey(f"key file {path} is readable by others: chmod 600 {path}")
    with open(path) as f:
        key = f.read().strip()
    if not key:
        raise NoKey(f"key file {path} is empty")
    return key.encode(), path


def parse_address(text: str, what: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad {what} {text!r}: expected HOST:PORT")
    return host, int(port)


def connect(address: tuple[str, int] | str, key: bytes, timeout: float = HANDSHAKE_S
            ) -> Connection:
    """A connection to a dashboard (HOST, PORT) or to a node's relay (a Unix socket's path),
    both ends proven to hold the key. Every step waits at most `timeout` s (OSError after);
    afterwards a send waits at most SEND_S, a read for ever."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            if not same_user(sock):  # a name any user may take: ours only
                raise ConnectionRefusedError(f"{address!r} is another user's")
        except BaseException:
            sock.close()
            raise
    else:
        sock = socket.create_connection(address, timeout=timeout)
    sock.setblocking(True)  # Connection reads the descriptor directly: limits go in the kernel
    conn = Connection(sock.detach())
    try:
        _limit(conn, timeout, timeout)
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
        _limit(conn, 0, SEND_S)
    except BaseException:
        conn.close()
        raise
    return conn


def same_user(sock: socket.socket) -> bool:
    """Whether the process at the other end of a Unix socket runs as this one's user."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def handshake(conn: Connection, key: bytes, timeout: float = HANDSHAKE_S) -> None:
    """The listening side of connect(); raises AuthenticationError for a wrong key, OSError for a
    peer that takes over `timeout` s over a step."""
    _limit(conn, timeout, timeout)
    deliver_challenge(conn, key)
    answer_challenge(conn, key)
    _limit(conn, 0, SEND_S)


def wake(conn: Connection) -> None:
    """End a connection's blocking read (its reader then closes it) without closing it here:
    closing it under a blocked reader would free its number for another file."""
    try:
        sock = socket.socket(fileno=conn.fileno())
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()  # the descriptor stays the connection's


def _limit(conn: Connection, read_s: float, send_s: float) -> None:
    """Kernel time limits on a connection's reads and sends (0: none): a blocked call then
    fails with EAGAIN, which Connection raises as OSError."""
    sock = socket.socket(fileno=conn.fileno())
    try:
        for opt, seconds in ((socket.SO_RCVTIMEO, read_s), (socket.SO_SNDTIMEO, send_s)):
            whole = int(seconds)
            sock.setsockopt(socket.SOL_SOCKET, opt,
                            struct.pack("ll", whole, int((seconds - whole) * 1e6)))
    finally:
        sock.detach()  # the descriptor stays the connection's


def send(conn: Connection, message: Event | Order) -> None:
    conn.send_bytes(encode(message).encode())


def receive(conn: Connection) -> Event | Order | None:
    """The next message: an event, or an order; None for one that does not decode.
    Raises EOFError when the peer is gone, MessageTooLong for an oversized message, OSError when
    the connection fails."""
    try:
        data = conn.recv_bytes(MAX_MESSAGE)
    except OSError as e:
        if "bad message length" in str(e):  # multiprocessing's word for over maxlength
            raise MessageTooLong(f"message over {MAX_MESSAGE} bytes") from None
        raise
    return message_of(data)
