"""The TCP connections a rank's world was formed with, and cutting them when a peer dies: what
waits on one of them, in this process or at the other end, then fails at once.

gloo cannot abort a collective in flight (its abort leaves the connections of a group that DDP
still holds open), so a survivor could wait for ever on a peer that had gone on to the next
world; NCCL's abort does not need this, but no abort reaches NCCL's set-up (torch holds the
communicator's lock while it waits), which shutting its listening sockets ends.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

Sockets = frozenset  # of (fd, inode): the same fd may later name another socket


def open_sockets() -> Sockets:
    """This process's sockets (none where /proc is not there)."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if target.startswith("socket:"):
                    found.add((int(name), target))
    return frozenset(found)


def tcp_sockets(sockets: Sockets, skip: set[int] = frozenset()) -> Iterator[socket.socket]:
    """Each of `sockets` (but the fds in `skip`) still open as the same TCP socket, as a
    duplicate that is closed after: shutting it down shuts the socket itself. A Unix socket
    made meanwhile by another thread (a pipe to a worker) is no part of any world."""
    for fd, inode in sockets:
        if fd in skip:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != inode:
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:  # closed meanwhile
            continue
        with s:
            if s.family in (socket.AF_INET, socket.AF_INET6):
                yield s


def sever(sockets: Sockets, peer_port: int | None = None) -> int:
    """Shut down each of `sockets` still open as the same socket (those connected to
    `peer_port` only, where given); how many were."""
    cut = 0
    for s in tcp_sockets(sockets):
        try:
            # A connection only: shut, a listening socket fails gloo's or the store's accepting
            # thread, which ends the process.
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) or \
                    peer_port not in (None, s.getpeername()[1]):
                continue
            s.shutdown(socket.SHUT_RDWR)
            cut += 1
        except OSError:  # no connection to shut
            pass
    return cut


def _watched() -> set[int]:
    """The fds some event loop of this process (an epoll set: gloo's, the store's) watches."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventpoll]":
                    with open(f"/proc/self/fdinfo/{name}", encoding="ascii") as info:
                        found.update(int(line.split()[1]) for line in info
                                     if line.startswith("tfd:"))
    return found


def shut_listeners(sockets: Sockets, keep_port: int | None = None) -> int:
    """Shut down each of `sockets` that listens for TCP connections and that no event loop
    watches (NCCL's, which it accepts on in a polling loop that then fails at once); how many.
    A listener in an event loop is gloo's or a store's, whose thread would end the process."""
    cut = 0
    for s in tcp_sockets(sockets, skip=_watched()):
        try:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and \
                    s.getsockname()[1] != keep_port:
                s.shutdown(socket.SHUT_RDWR)
                cut += 1
        except OSError:
            pass
    return cut
