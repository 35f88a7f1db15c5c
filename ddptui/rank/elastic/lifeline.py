"""Ties a process's life to its parent's: a rank, or a DataLoader worker, never outlives the
process that started it, even when that parent is killed with SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send us `sig` when the parent thread dies (Linux PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def watch_parent(parent_pid: int, interval: float = 0.5) -> None:
    """Belt and braces for PDEATHSIG (other OSes, a parent that died before prctl): a daemon
    thread that ends the process within `interval` of the parent (or the parent of the fork
    server it came from) disappearing."""

    def watch() -> None:
        while True:
            if not descends_from(parent_pid):
                os._exit(1)
            time.sleep(interval)

    if not descends_from(parent_pid):
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def descends_from(ancestor: int) -> bool:
    """Whether `ancestor` is this process's parent, or its parent's parent (a DataLoader worker
    of a fork server the rank started). An orphan's new parent is init or a subreaper: a rank
    that died, even one not yet reaped, is neither. Without /proc, assumed so."""
    parent = os.getppid()
    if parent == ancestor:
        return True
    try:
        with open(f"/proc/{parent}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1]) == ancestor
    except (OSError, ValueError, IndexError):
        return not os.path.isdir("/proc")
