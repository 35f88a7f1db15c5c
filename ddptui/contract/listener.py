"""The listening end of the ranks' report channel (ddptui/contract/channel.py): authenticates
every connection, hands each event on, and sends the dashboard's orders. `ddptui attach` listens
for torchrun and srun jobs; `ddptui run SCRIPT` for its ranks that call ddptui.init().
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener

from ddptui.contract.channel import HANDSHAKE_S, MessageTooLong, handshake, receive, send, wake
from ddptui.contract.protocol.events import Event, Rank
from ddptui.contract.protocol.orders import Order
from ddptui.contract.protocol.relay import Relay
from ddptui.contract.states import RankState

REFUSALS_SAID = 10
# An order a rank must get (a world change) waits this long for a rank between two connections
# of its link, at most HELD_MOST of them a rank.
HOLD_S = 10.0
HELD_MOST = 16
# The rank states a process announces itself in.
TAKES_OVER = (RankState.STANDBY, RankState.RUNNING, RankState.RESTARTING)


class ReportListener:
    """start() accepts on a thread; record(ev) is called from the connections' threads."""

    def __init__(self, address: tuple[str, int], key: bytes, record: Callable[[Event], None],
                 note: Callable[[str, str], None], closed: Callable[[], None] = lambda: None,
                 relay_lost: Callable[[str, set[int]], None] = lambda node, ranks: None,
                 hold_s: float = HOLD_S):
        """`relay_lost(node, ranks)`: a node's relay went away with those ranks' link;
        `hold_s`: how long tell() holds an order for a rank with no connection."""
        self.key, self.record, self.note, self.closed = key, record, note, closed
        self.relay_lost = relay_lost
        self._relays: dict[Connection, str] = {}  # a node's relay's connection -> its node
        self._sending = threading.Lock()  # a relay's connection carries orders of many threads
        # No authkey here: each handshake runs in its thread. The listen queue holds a whole
        # job's ranks connecting at once (multiprocessing's default of one dropped 12 of 32).
        self._listener = Listener(address, backlog=socket.SOMAXCONN)
        self.address: tuple[str, int] = self._listener.address
        self._lock = threading.Lock()
        self._conns: dict[int, Connection] = {}  # rank -> its connection
        # rank -> the open connections it spoke on, oldest first: where its orders go when the
        # routed one closes (a link that reconnected before its old connection's close was read)
        self._heard: dict[int, list[Connection]] = {}
        self.hold_s = hold_s
        self._held: dict[int, list[Order]] = {}  # rank -> tell()'s orders waiting for it
        self._telling = threading.Lock()  # one delivery of held orders at a time
        self._open: set[Connection] = set()
        self._closing = False
        self._refused = 0  # connections refused so far
        self._ending: set[int] = set()  # pids ended on purpose: their connections' loss is no news
        # A script's ranks without a process group cannot agree on a step: each takes the
        # orders itself (they said so in a `rank` event with `alone`).
        self._alone = False
        self.leader = 0  # the world's rank 0 (a script's after run.elastic: whoever is first)

    def start(self) -> None:
        threading.Thread(target=self._accept, name="report-accept", daemon=True).start()

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closing = True
        # A socket closed while a thread blocks in accept() on it stays bound until that call
        # returns (Linux): shutdown() wakes it, so the port is free at once (attach restarted
        # in one process, tests).
        sock = getattr(getattr(self._listener, "_listener", None), "_socket", None)
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:  # each reader closes its own connection, once (see _serve)
            for conn in self._open:
                wake(conn)

    def ending(self, pid: int) -> None:
        """The process `pid` is being ended on purpose (a standby the run's end left with
        nothing to join): its connection breaking is no news."""
        with self._lock:
            self._ending.add(pid)

    def idle(self) -> bool:
        with self._lock:
            return not self._open

    def connected(self) -> set[int]:
        with self._lock:
            return set(self._conns)

    def order(self, cmd: Order) -> bool:
        """An order for the whole run: to the world's rank 0, which agrees it with the others at
        one step; to every rank when they have no process group to agree through."""
        if not self._alone:
            return self.send(self.leader, cmd)
        return all([self.send(rank, cmd) for rank in sorted(self.connected())])

    def send(self, rank: int, cmd: Order) -> bool:
        """Send a command to `rank`; False (and a warning in the log) when it cannot be."""
        with self._lock:
            conn = self._conns.get(rank)
        if conn is None:
            self.note("warning", f"rank {rank} is not connected: the command was not sent")
            return False
        if not self._send_on(conn, rank, cmd):
            self.note("warning", f"rank {rank}'s connection broke: the command was not sent")
            return False
        return True

    def _send_on(self, conn: Connection, rank: int, cmd: Order) -> bool:
        """`cmd` on `conn` (a relay's names its rank); False where the connection broke."""
        try:
            with self._sending:
                send(conn, cmd.replace(to=rank) if conn in self._relays else cmd)
        except (OSError, ValueError):
            wake(conn)  # a send cut short leaves half a message: the rank connects again
            return False
        return True

    def tell(self, rank: int, cmd: Order) -> None:
        """An order `rank` must get (a world change: without it the rank waits for a world that
        has moved on), after every order told it before: sent now; or, while the rank has no
        connection (or its send fails), held and sent when it speaks again, said as not sent
        after hold_s."""
        with self._lock:
            held = self._held.setdefault(rank, [])
            kept = len(held) < HELD_MOST
            if kept:
                held.append(cmd)
        if not kept:
            self.note("warning", f"rank {rank} is not connected: the command was not sent "
                      f"({HELD_MOST} held for it already)")
            return
        timer = threading.Timer(self.hold_s, self._give_up, (rank, cmd))
        timer.daemon = True
        timer.start()
        self._deliver(rank)

    def drop_held(self) -> None:
        """A new attempt's world begins: what was told the last one's ranks is void."""
        with self._telling, self._lock:
            self._held.clear()

    def _deliver(self, rank: int) -> None:
        """`rank`'s held orders, oldest first, while its connection takes them: one delivery at
        a time, so that a newer order never overtakes one held for the rank."""
        with self._telling:
            while True:
                with self._lock:
                    held, conn = self._held.get(rank), self._conns.get(rank)
                    if not held:
                        self._held.pop(rank, None)
                    if not held or conn is None:
                        return
                    cmd = held[0]
                if not self._send_on(conn, rank, cmd):
                    return  # kept: the rank connects again, and its next event brings it
                with self._lock:
                    held.remove(cmd)

    def _give_up(self, rank: int, cmd: Order) -> None:
        with self._telling, self._lock:
            held = self._held.get(rank, [])
            late = any(c is cmd for c in held)
            if late:
                held.remove(cmd)
        if late and not self._closing:
            self.note("warning", f"rank {rank} is not connected: the command was not sent "
                      f"(held {self.hold_s:.0f} s for it)")

    def _accept(self) -> None:
        while not self._closing:
            try:
                conn = self._listener.accept()
            except OSError:  # closed by close()
                return
            peer = _peer(self._listener)
            threading.Thread(target=self._serve, args=(conn, peer), name="report-conn",
                             daemon=True).start()

    def _refuse(self, peer: str, why: str) -> None:
        """Said in full up to REFUSALS_SAID, then once a thousand: a port scanner or a flood
        of bad peers writes a few lines into the run's log, not one a try."""
        with self._lock:
            self._refused += 1
            n = self._refused
        if n <= REFUSALS_SAID or n % 1000 == 0:
            self.note("warning", f"refused a connection from {peer}: {why}" + (
                f" ({n:,} refused so far; said again at each thousand)"
                if n >= REFUSALS_SAID else ""))

    def _serve(self, conn: Connection, peer: str) -> None:
        # The whole handshake within its limit (each read has one; a peer dripping a byte at a
        # time would pass every read's): past it the connection is shut, and the read fails.
        deadline = threading.Timer(HANDSHAKE_S, wake, (conn,))
        deadline.daemon = True  # a handshake under way at the process's exit does not hold it
        deadline.start()
        try:
            handshake(conn, self.key)
        except (AuthenticationError, EOFError, OSError) as e:
            deadline.cancel()
            self._refuse(peer, "wrong key" if isinstance(e, AuthenticationError)
                         else "no handshake")
            conn.close()
            return
        deadline.cancel()
        with self._lock:
            self._open.add(conn)
        ranks: set[int] = set()
        pids: set[int] = set()
        try:
            while True:
                ev = receive(conn)
                if not isinstance(ev, Event):
                    continue  # malformed, or not an event: dropped, the dashboard goes on
                if isinstance(ev, Relay):  # a node's ranks come on this connection
                    with self._lock:
                        self._relays[conn] = ev.node or peer
                        # hung up on it: gone, or reporting directly
                        self._forget(conn, set(ev.left or ()))
                    continue
                ranks.add(ev.rank)
                if isinstance(ev, Rank) and ev.pid is not None:
                    pids.add(ev.pid)
                self._take(conn, ev)
        except MessageTooLong:
            self.note("warning", f"dropped the connection from {peer}: message over the size "
                      "limit")
        except (OSError, TypeError) as e:  # TypeError: closed by close() while reading
            # After close() every connection is closed on purpose, and so is an ended one's.
            if not self._closing and not pids & self._ending:
                self.note("warning", f"lost the connection from {peer}: "
                          f"{getattr(e, 'strerror', None) or e}")
        except EOFError:
            pass
        finally:
            # Closed here only, under the lock: close() closing it too raced this close (a
            # second close of a number the system may already have given to another file).
            with self._lock:
                self._open.discard(conn)
                conn.close()
                routed = self._forget(conn, ranks)
                node = self._relays.pop(conn, None)
            if node is not None and not self._closing:
                self.relay_lost(node, routed)  # not those that went elsewhere since
            self.closed()

    def _forget(self, conn: Connection, ranks: set[int]) -> set[int]:
        """`conn` closed (under the lock): the ranks it carried that have no connection now. A
        rank routed through it that still has another takes its orders on its newest one."""
        lost = set()
        for r in ranks:
            rest = [c for c in self._heard.get(r, ()) if c is not conn]
            if self._conns.get(r) is conn:
                if rest:
                    self._conns[r] = rest[-1]
                else:
                    del self._conns[r]
                    lost.add(r)
            if rest:
                self._heard[r] = rest
            else:
                self._heard.pop(r, None)
        return lost

    def _take(self, conn: Connection, ev: Event) -> None:
        with self._lock:
            if self._conns.get(ev.rank) in self._relays and conn not in self._relays:
                self._conns[ev.rank] = conn  # a rank whose relay went: directly from now on
            else:
                route(self._conns, ev, conn)
            heard = self._heard.setdefault(ev.rank, [])
            if conn not in heard:
                heard.append(conn)
            self._alone = self._alone or isinstance(ev, Rank) and bool(ev.alone)
            held = bool(self._held.get(ev.rank))
        if held:  # tell()'s, for a rank that had no connection: it has one now
            self._deliver(ev.rank)
        self.record(ev)


def route(routes: dict[int, Connection], ev: Event, conn: Connection) -> None:
    """Where `ev`'s rank takes its orders from now on (attach's, and a node's relay's). A
    process that announces itself for a rank takes them: a standby for rank 1 says it is warm
    while the rank 1 that left may still be connected, and the join order must reach the
    standby. Otherwise the first connection the rank spoke on keeps them."""
    if isinstance(ev, Rank) and ev.state in TAKES_OVER:
        routes[ev.rank] = conn
    else:
        routes.setdefault(ev.rank, conn)


def _peer(listener: Listener) -> str:
    addr = listener.last_accepted
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
