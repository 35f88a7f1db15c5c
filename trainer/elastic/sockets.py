"""The TCP connections a rank's world was formed with, and cutting them when a peer dies: what
waits on one of them, in this process or at the other end, then fails at once.

gloo cannot abort a collective in flight (its abort leaves the connections of a group that DDP
still holds open), so a survivor could wait for ever on a peer that had gone on to the next
world; NCCL's abort does not need this.
"""

from __future__ import annotations

import contextlib
import os
import socket

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


def sever(sockets: Sockets, peer_port: int | None = None) -> int:
    """Shut down each of `sockets` still open as the same socket (those connected to
    `peer_port` only, where given); how many were."""
    cut = 0
    for fd, inode in sockets:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != inode:
                continue
            with socket.socket(fileno=os.dup(fd)) as s:  # the connection, not just this fd
                # A TCP connection only: shut, a listening socket fails gloo's or the store's
                # accepting thread, which ends the process; a Unix socket made meanwhile by
                # another thread (a pipe to a worker) is no part of the world.
                if s.family not in (socket.AF_INET, socket.AF_INET6) or \
                        s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) or \
                        peer_port not in (None, s.getpeername()[1]):
                    continue
                s.shutdown(socket.SHUT_RDWR)
            cut += 1
        except OSError:  # closed meanwhile, or no connection to shut
            pass
    return cut
