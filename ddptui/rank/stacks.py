"""How a rank answers `t`: faulthandler writes every thread's Python stack from C on a signal, so
it answers while the main thread is stuck in a call that never returns.

Loaded in every kind of rank (the built-in loop, a script's, a spawned or wrapped one) before
its own code runs; the standard library alone.
"""

from __future__ import annotations

import faulthandler
import signal
from typing import TextIO


def answer_stacks(signum: int, file: TextIO | None = None) -> None:
    """Write every thread's stack to `file` (stderr: None) on `signum`. A signal whose default
    ends the process is set to be ignored first: faulthandler puts back the handler it found
    when Python finalizes, so a request that comes after the rank's last line (its interpreter
    ending, a process group torn down) is ignored instead of killing it."""
    try:
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, signal.SIG_IGN)
    except ValueError:  # not the main thread: faulthandler alone, as before
        pass
    if file is None:
        faulthandler.register(signum, all_threads=True)
    else:
        faulthandler.register(signum, file=file, all_threads=True)
