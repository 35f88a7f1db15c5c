"""Loopback ports for the worlds a run forms: free now, and below the range the kernel hands out.
"""

from __future__ import annotations

import random
import socket
from collections import deque

# The ports handed out lately, each held by a bound socket that is not listening: another pick
# (this process's or another ddptui's on the machine) is refused it, and rank 0's store, which
# binds with SO_REUSEADDR as this socket does, takes it over: two runs side by side never pick
# one port before either listens.
HELD: deque[socket.socket] = deque(maxlen=16)


def free_port() -> int:
    """A loopback port for a rendezvous, free now, held for this run (HELD), and below the
    range the kernel hands out to connections and to bind(0) (as torchrun's 29500 is), where any
    socket may take it between this pick and rank 0's store listening on it."""
    low = ephemeral_ports()[0]
    for _ in range(200):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", random.randrange(max(1024, low - 10000), low)))
        except OSError:  # in use, held, or in TIME_WAIT
            s.close()
            continue
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if len(HELD) == HELD.maxlen:
            HELD[0].close()
        HELD.append(s)
        return s.getsockname()[1]
    with socket.socket() as s:  # every one tried was busy: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for connections and bind(0) (Linux's default elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999
