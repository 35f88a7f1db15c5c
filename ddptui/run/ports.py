"""Loopback ports for the worlds a run forms: free now, and below the range the kernel hands out.
"""

from __future__ import annotations

import random
import socket


def free_port() -> int:
    """A loopback port for a rendezvous, free now and below the range the kernel hands out to
    connections and to bind(0) (as torchrun's 29500 is): one from that range was taken by some
    other socket between this pick and rank 0's store listening on it (EADDRINUSE, the run
    lost: 2 x H100, a recovery after a joiner was killed)."""
    low = ephemeral_ports()[0]
    for _ in range(200):
        port = random.randrange(max(1024, low - 10000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use, or held in TIME_WAIT
                continue
            return port
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
