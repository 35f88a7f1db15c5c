"""A node's relay: the ranks of a node under `python -m ddptui.wrap` report to `ddptui attach`
through it, so attach holds one connection and one thread a node, not one a rank.

Local rank 0's sidecar starts it (sidecar.py) on a Unix socket whose path each rank of the node
works out alike (remote.relay_path). It passes each rank's events on as they come (each rank's
link has already rolled up its per-step telemetry: contract/rollup.py) over one link of its own,
which opens with a `relay` event and every rank's clock, and passes each order attach sends back
(`to`: its rank) to that rank alone. It serves until its parent is gone and every rank of the node
has hung up, or 3 s after a SIGTERM; a rank that loses it reports directly from then on.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener

from ddptui.contract.channel import (
    HANDSHAKE_S,
    MessageTooLong,
    handshake,
    load_key,
    parse_address,
    receive,
    same_user,
    send,
    wake,
)
from ddptui.contract.listener import route
from ddptui.contract.protocol.events import PARENT, Clock, Event
from ddptui.contract.protocol.relay import Relay
from ddptui.rank.telemetry.remote import RemoteLink, relay_path

HELD = 80_000  # events held for attach while it is away: a node of 8 ranks' 10,000 each
HANDSHAKES = 32  # at once, at most: a peer that connects and says nothing holds one 10 s
# Imports nothing from the job's folder, which -c puts first on the path (as the sidecar's).
COMMAND = ("import sys; del sys.path[0]; from ddptui.rank.wrap.relay import main; "
           "sys.exit(main(sys.argv[1:]))")


def start(report: str, address: tuple[str, int], key: bytes, node: str) -> str | None:
    """The relay a rank's sidecar reports through (its path), None where its node has one rank
    or DDPTUI_RELAY=0; local rank 0's sidecar starts it, a child that outlives it only while
    its node's ranks still report."""
    path = relay_path(address, key, node)
    if path is None or int(os.environ.get("LOCAL_WORLD_SIZE") or 0) < 2:
        return None
    if os.environ.get("LOCAL_RANK") == "0":
        try:  # (an abstract name goes on the command line as ss writes it: @name)
            proc = subprocess.Popen([sys.executable, "-c", COMMAND, "--report", report, "--path",
                                     path.replace("\0", "@", 1), "--node", node, "--parent",
                                     str(os.getpid())], stdin=subprocess.DEVNULL, close_fds=True)
        except OSError as e:
            _warn(f"not started ({e.strerror or e}): each rank reports directly")
        else:  # reaped as it ends, killed or done: no zombie while this sidecar lives
            threading.Thread(target=proc.wait, name="relay-reaper", daemon=True).start()
    return path


class NodeRelay:
    """serve() until its parent is gone and its ranks have hung up."""

    def __init__(self, upstream: tuple[str, int], key: bytes, path: str, node: str):
        self.key, self.path, self.node = key, path, node
        self.listener = bind(path)
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # an order's send, and a connection's close
        self._ranks: dict[int, Connection] = {}  # rank -> the connection its orders go on
        self._open: set[Connection] = set()
        self._handshakes = threading.BoundedSemaphore(HANDSHAKES)
        self.link = RemoteLink(upstream, key, node, _warn, limit=HELD, every=0.0,
                               hello=self._hello) if self.listener is not None else None

    def serve(self, parent: int) -> None:
        """Until its parent is gone and every rank has hung up (each sidecar's end is bounded)."""
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()
        threading.Thread(target=self._orders, name="relay-orders", daemon=True).start()
        while True:
            time.sleep(0.25)
            if os.getppid() != parent:  # its rank has ended: no rank of the node joins now
                self._stop_listening()
                with self._lock:
                    if not self._open:
                        break
        assert self.link is not None
        self.link.close()

    def _hello(self) -> list[Event]:
        with self._lock:
            ranks = sorted(self._ranks)
        return [Relay(rank=PARENT, node=self.node, pid=os.getpid()),
                *(Clock(rank=r, node=self.node) for r in ranks)]

    def _stop_listening(self) -> None:
        if self.listener is None:
            return
        if not self.path.startswith("\0"):  # a file: a rank that starts now finds none
            try:
                os.unlink(self.path)
            except OSError:
                pass
        sock = getattr(getattr(self.listener, "_listener", None), "_socket", None)
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
            self.listener.close()
        except OSError:
            pass
        self.listener = None

    def _accept(self) -> None:
        while (listener := self.listener) is not None:
            try:
                conn = listener.accept()
            except OSError:
                return
            if not _ours(conn) or not self._handshakes.acquire(blocking=False):
                conn.close()  # another user's, or past the handshakes under way at once
                continue
            threading.Thread(target=self._serve, args=(conn,), name="relay-rank",
                             daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        deadline = threading.Timer(HANDSHAKE_S, wake, (conn,))
        deadline.daemon = True
        deadline.start()
        try:
            handshake(conn, self.key)
        except (AuthenticationError, EOFError, OSError):
            conn.close()
            return
        finally:
            deadline.cancel()
            self._handshakes.release()
        with self._lock:
            self._open.add(conn)
        try:
            while True:
                ev = receive(conn)
                if isinstance(ev, Event) and ev.rank >= 0:
                    self._take(conn, ev)
        except (EOFError, OSError, MessageTooLong, TypeError):
            pass
        finally:
            with self._sending, self._lock:
                self._open.discard(conn)
                conn.close()
                left = [r for r, c in self._ranks.items() if c is conn]
                for rank in left:
                    del self._ranks[rank]
            if left:  # its orders no longer come here
                assert self.link is not None
                self.link.put(Relay(rank=PARENT, node=self.node, pid=os.getpid(), left=left))

    def _take(self, conn: Connection, ev: Event) -> None:
        with self._lock:
            route(self._ranks, ev, conn)
        assert self.link is not None
        if isinstance(ev, Clock) and not self.link.connected:
            return  # a clock kept for later would be stale: the link's hello sends a fresh one
        self.link.put(ev)

    def _orders(self) -> None:
        """attach's orders, each to the rank it names."""
        assert self.link is not None
        while True:
            try:
                order = self.link.inbox.recv()
            except EOFError:
                return
            with self._sending:  # the connection is not closed meanwhile
                with self._lock:
                    conn = self._ranks.get(order.to) if order.to is not None else None
                if conn is None:
                    continue  # that rank has hung up: attach is told so (`left`)
                try:
                    send(conn, order.replace(to=None))
                except (OSError, ValueError):
                    wake(conn)


def bind(path: str) -> Listener | None:
    """The relay's listener at `path`; a socket file left by a relay that died is taken over,
    one another relay still listens on is left to it (None)."""
    for _ in range(2):
        try:
            return Listener(path, family="AF_UNIX", backlog=socket.SOMAXCONN)
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(path)
            return None  # a live relay
        except OSError:
            if path.startswith("\0"):
                return None  # a name, held: not ours to take
            os.unlink(path)
        finally:
            probe.close()
    return None


def _ours(conn: Connection) -> bool:
    """The peer runs as this user (abstract names are open to every user of the host)."""
    sock = socket.socket(fileno=conn.fileno())
    try:
        return same_user(sock)
    except OSError:
        return False
    finally:
        sock.detach()


def _warn(text: str) -> None:
    print(f"ddptui.wrap: relay: {text}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ddptui.rank.wrap.relay", description=__doc__)
    p.add_argument("--report", required=True, help="attach's HOST:PORT")
    p.add_argument("--path", required=True, help="the Unix socket the node's ranks connect to")
    p.add_argument("--node", required=True)
    p.add_argument("--parent", type=int, required=True)
    args = p.parse_args(argv)
    try:
        path = "\0" + args.path[1:] if args.path.startswith("@") else args.path
        relay = NodeRelay(parse_address(args.report, "DDPTUI_REPORT"), load_key()[0], path,
                          args.node)
    except OSError as e:
        _warn(f"not started ({e.strerror or e}): each rank reports directly")
        return 0
    if relay.listener is None:
        return 0  # another relay serves this node's job
    # Its end is its ranks' hanging up: a launcher's SIGTERM to the job's processes, or a
    # terminal's Ctrl-C, is theirs to answer (each sidecar's end is bounded).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    relay.serve(args.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
