"""The socket between ranks launched elsewhere (torchrun, srun) and `ddptui attach`: the shared
key, the handshake (HMAC challenge both ways), and size-capped JSON messages. No pickle crosses it.
"""

from __future__ import annotations

import os
import secrets
import stat
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

from ddptui.contract.protocol.codec import encode, message_of
from ddptui.contract.protocol.events import Event
from ddptui.contract.protocol.orders import Order

KEY_ENV = "DDPTUI_AUTHKEY"
KEY_FILE_ENV = "DDPTUI_AUTHKEY_FILE"
MAX_MESSAGE = 1 << 20  # bytes; a longer message drops the connection


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


def connect(address: tuple[str, int], key: bytes) -> Connection:
    """A connection to a dashboard, both ends proven to hold the key."""
    return Client(address, authkey=key)


def handshake(conn: Connection, key: bytes) -> None:
    """The listening side of connect(); raises AuthenticationError for a wrong key."""
    deliver_challenge(conn, key)
    answer_challenge(conn, key)


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
