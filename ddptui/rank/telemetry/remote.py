"""--report HOST:PORT: a rank's telemetry to a `ddptui attach` dashboard, and its commands back,
through its node's relay (ddptui/rank/wrap/relay.py) where one listens, else directly.

Training never waits on the dashboard: events go to a bounded buffer that a thread sends; while
the dashboard is away the oldest are dropped (and counted) and the thread keeps reconnecting.
"""

from __future__ import annotations

import hashlib
import os
import queue
import random
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing import AuthenticationError

from ddptui.contract.channel import connect, receive, send, wake
from ddptui.contract.protocol.events import Clock, Event, Notice
from ddptui.contract.protocol.orders import Order
from ddptui.contract.rollup import fold, rollup_seconds
from ddptui.rank.telemetry.buffer import EventBuffer

RETRY_S = 2.0
RELAY_WAIT_S = 10.0  # a rank up before its node's relay listens tries it this long
RELAY_RETRY_S = 0.25


def node_name() -> str:
    """The host, plus the launcher's node rank: two agents on one machine are two nodes."""
    node_rank = os.environ.get("GROUP_RANK") or os.environ.get("SLURM_NODEID")
    return socket.gethostname() + (f"/{node_rank}" if node_rank else "")


def relay_path(address: tuple[str, int], key: bytes, node: str) -> str | None:
    """Where this node's relay for this dashboard listens: the same for each rank of a node's
    job, another for another job. On Linux a name in the abstract namespace (no file to leave
    behind, whatever TMPDIR's length); elsewhere a socket file in TMPDIR, where its path fits.
    None where DDPTUI_RELAY=0."""
    if os.environ.get("DDPTUI_RELAY") == "0":
        return None
    job = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID") or ""
    name = "ddptui-relay-" + hashlib.sha256(
        f"{address[0]}:{address[1]}|{node}|{job}|".encode() + key).hexdigest()[:24]
    if sys.platform.startswith("linux"):
        return "\0" + name
    path = os.path.join(tempfile.gettempdir(), f"{name}.sock")
    return path if len(path.encode()) < 100 else None


class RemoteLink:
    """One rank's link. `put` is what the Reporter calls; `inbox` is what the Mailbox reads."""

    def __init__(self, address: tuple[str, int], key: bytes, node: str, warn,
                 limit: int = 10_000, every: float | None = None, relay: str | None = None,
                 hello: Callable[[], list[Event]] | None = None):
        """`relay`: the node's relay to go through while it is there; `hello`: the events each
        connection opens with (a rank's clock, by default)."""
        self.address, self.key, self.node, self.warn = address, key, node, warn
        self.relay, self.hello = relay, hello or self._clock
        self.connected = False  # to the dashboard (or relay) now
        self.started = time.monotonic()
        # Telemetry gathered and folded this long before it goes (contract/rollup.py): a job of
        # hundreds of ranks sends a step event a second a rank, not twenty.
        self.every = rollup_seconds() if every is None else every
        self.buffer = EventBuffer(limit)
        self.rank: int | None = None  # the rank this link speaks for, from its first event
        self.inbox = _Inbox()
        self.thread = threading.Thread(target=self._run, name="report-link", daemon=True)
        self.thread.start()

    def put(self, ev: Event) -> None:
        self.rank = ev.rank if ev.rank >= 0 else self.rank
        self.buffer.put(ev.replace(node=self.node))

    def close(self, timeout: float = 3.0) -> None:
        """Send what is buffered (for up to `timeout` s if connected), then stop."""
        self.buffer.close()
        self.thread.join(timeout)
        self.inbox.close()

    def _run(self) -> None:
        where = f"{self.address[0]}:{self.address[1]}"
        refused_once = connected_once = absent_once = False
        while not self.buffer.closing:
            relayed = self.relay
            try:
                conn = connect(relayed or self.address, self.key)
            except AuthenticationError:
                if relayed:  # not our relay
                    self._relay_absent()
                    continue
                if not refused_once:
                    self.warn(f"the dashboard at {where} refused our key: check DDPTUI_AUTHKEY "
                              "or the key file")
                refused_once = True
                self._pause()
                continue
            except (OSError, EOFError, ValueError):  # absent, or a handshake that failed
                if relayed:
                    self._relay_absent()
                    continue
                if not (connected_once or absent_once):  # attach may come later: said once
                    self.warn(f"no dashboard at {where} yet: training goes on, and its latest "
                              f"{self.buffer.limit:,} events wait for `ddptui attach --listen "
                              f"{where}`")
                absent_once = True
                self._pause()
                continue
            connected_once = self.connected = True
            reader = threading.Thread(target=self._read, args=(conn,), name="report-commands",
                                      daemon=True)
            reader.start()
            self._feed(conn)
            self.connected = False
            wake(conn)  # ends the reader's blocking read
            reader.join(5.0)
            conn.close()  # here alone: the reader closing it raced a send on this thread
            if relayed and not self.buffer.closing:
                self.warn("the node's relay went away: reporting to the dashboard directly")
                self.relay = None

    def _relay_absent(self) -> None:
        """Its node's relay is not listening (yet: local rank 0 starts it): tried again for a
        while, then the dashboard directly."""
        if time.monotonic() - self.started < RELAY_WAIT_S:
            time.sleep(RELAY_RETRY_S)
        else:
            self.relay = None

    def _pause(self) -> None:
        """Wait before trying again, a little longer or shorter a rank: a whole job whose
        dashboard came back does not knock at the same instant every time."""
        time.sleep(RETRY_S * random.uniform(0.75, 1.25))

    def _clock(self) -> list[Event]:
        # First, so that attach can place a backlog by when it was sent
        return [] if self.rank is None else [Clock(rank=self.rank, node=self.node)]

    def _feed(self, conn) -> None:
        try:
            for ev in self.hello():
                send(conn, ev)
        except (OSError, ValueError):
            return
        while (taken := self.buffer.take()) is not None:
            batch, dropped = taken
            if self.every:
                batch = fold(batch)
            # Each rank's own count (a relay's link carries a node's ranks)
            notices = [Notice(rank=r, level="warning", node=self.node,
                              text=f"{n} events dropped while the dashboard was away")
                       for r, n in sorted(dropped.items()) if r is not None and r >= 0]
            sent = 0
            try:
                for ev in notices + batch:
                    send(conn, ev)
                    sent += 1
            except (OSError, ValueError):  # gone: keep what was not sent (only), reconnect
                untold = Counter({ev.rank: dropped[ev.rank] for ev in notices[sent:]})
                self.buffer.restore(batch[max(0, sent - len(notices)):], untold)
                return
            if self.every:
                self.buffer.rest(self.every)

    def _read(self, conn) -> None:
        try:
            while True:
                msg = receive(conn)
                if isinstance(msg, Order):
                    self.inbox.put(msg)
        except (EOFError, OSError):
            pass


class _Inbox:
    """Commands from the dashboard, read like the supervisor's pipe (recv blocks)."""

    def __init__(self):
        self.q: queue.Queue = queue.Queue()

    def put(self, msg: Order) -> None:
        self.q.put(msg)

    def recv(self) -> Order:
        msg = self.q.get()
        if msg is None:
            raise EOFError
        return msg

    def close(self) -> None:
        self.q.put(None)
