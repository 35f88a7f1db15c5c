"""--report HOST:PORT: a rank's telemetry to a `ddptui attach` dashboard, and its commands back.

Training never waits on the dashboard: events go to a bounded buffer that a thread sends; while
the dashboard is away the oldest are dropped (and counted) and the thread keeps reconnecting.
"""

from __future__ import annotations

import os
import queue
import random
import socket
import threading
import time
from multiprocessing import AuthenticationError

from ddptui.contract.channel import connect, receive, send, wake
from ddptui.contract.protocol.events import Clock, Event, Notice
from ddptui.contract.protocol.orders import Order
from ddptui.contract.rollup import fold, rollup_seconds
from ddptui.rank.telemetry.buffer import EventBuffer

RETRY_S = 2.0


def node_name() -> str:
    """The host, plus the launcher's node rank: two agents on one machine are two nodes."""
    node_rank = os.environ.get("GROUP_RANK") or os.environ.get("SLURM_NODEID")
    return socket.gethostname() + (f"/{node_rank}" if node_rank else "")


class RemoteLink:
    """One rank's link. `put` is what the Reporter calls; `inbox` is what the Mailbox reads."""

    def __init__(self, address: tuple[str, int], key: bytes, node: str, warn,
                 limit: int = 10_000, every: float | None = None):
        self.address, self.key, self.node, self.warn = address, key, node, warn
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
            try:
                conn = connect(self.address, self.key)
            except AuthenticationError:
                if not refused_once:
                    self.warn(f"the dashboard at {where} refused our key: check DDPTUI_AUTHKEY "
                              "or the key file")
                refused_once = True
                self._pause()
                continue
            except (OSError, EOFError, ValueError):  # absent, or a handshake that failed
                if not (connected_once or absent_once):  # attach may come later: said once
                    self.warn(f"no dashboard at {where} yet: training goes on, and its latest "
                              f"{self.buffer.limit:,} events wait for `ddptui attach --listen "
                              f"{where}`")
                absent_once = True
                self._pause()
                continue
            connected_once = True
            reader = threading.Thread(target=self._read, args=(conn,), name="report-commands",
                                      daemon=True)
            reader.start()
            self._feed(conn)
            wake(conn)  # ends the reader's blocking read
            reader.join(5.0)
            conn.close()  # here alone: the reader closing it raced a send on this thread

    def _pause(self) -> None:
        """Wait before trying again, a little longer or shorter a rank: a whole job whose
        dashboard came back does not knock at the same instant every time."""
        time.sleep(RETRY_S * random.uniform(0.75, 1.25))

    def _feed(self, conn) -> None:
        if self.rank is not None:
            try:  # first, so that attach can place a backlog by when it was sent
                send(conn, Clock(rank=self.rank, node=self.node))
            except (OSError, ValueError):
                return
        while (taken := self.buffer.take()) is not None:
            batch, dropped = taken
            if self.every:
                batch = fold(batch)
            notice = [Notice(rank=batch[0].rank, level="warning", node=self.node,
                             text=f"{dropped} events dropped while the dashboard was away")
                      ] if dropped else []
            sent = 0
            try:
                for ev in notice + batch:
                    send(conn, ev)
                    sent += 1
            except (OSError, ValueError):  # gone: keep what was not sent (only), reconnect
                told = sent - len(notice)
                self.buffer.restore(batch[max(0, told):], dropped if told < 0 else 0)
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
