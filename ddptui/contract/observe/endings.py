"""How a rank's process ended, told from outside: its exit code or signal in words, and where it
crashed itself, the error it printed (a CUDA error, a device assert, its exception).
"""

from __future__ import annotations

import os
import re
import signal

from ddptui.contract.observe.output import EXCEPTION
from ddptui.contract.observe.stacks import innermost
from ddptui.contract.protocol.codec import decode
from ddptui.contract.protocol.events import Run


def ended_how(code: int | None) -> str:
    """How a process ended, in words, from its exit code alone (negative: a signal)."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


# Signals a process raises on itself when it crashes (an abort, a bad address), as opposed to
# those another process sends (SIGKILL, SIGTERM): only then does its output say why.
JOB_GRACE_S = 10.0  # K on a job: SIGTERM to every wrapped rank, then SIGKILL after this long
SELF_INFLICTED = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
_DEVICE_ERROR = re.compile(r"Assertion .* failed|device-side assert|CUDA error|cudaError\w+|"
                           r"illegal (?:memory access|address|instruction)|NCCL error|"
                           r"^(?:malloc|free|realloc)\(\): |double free or corruption", re.I)
_SOURCE_FOLDERS = re.compile(r"^/\S*/")  # an assert's /pytorch/aten/.../IndexKernel.cu:111
_WORDS = re.compile(r"[^\W\d_]{2}")


def crash_cause(code: int | None, lines: list[str]) -> str:
    """Why a process died, for the user: its signal when one ended it (what it printed last
    is then no cause: a warning, a worker's broken pipe), with the CUDA error or device assert
    it printed where it crashed itself (else the Python exception it printed last: gloo aborts
    some processes at exit); else its exception's line (else its last line with words in it: a
    launcher's summary ends in a row of '=')."""
    if code is None or code >= 0:
        raised = [line.strip() for line in lines if EXCEPTION.match(line.strip())]
        said = [line.strip() for line in lines if _WORDS.search(line)]
        return (raised or said or [ended_how(code)])[-1]
    how = ended_how(code)
    if -code not in SELF_INFLICTED:
        return how
    found = [line.strip() for line in lines if _DEVICE_ERROR.search(line.strip())]
    asserts = [line for line in found if "Assertion" in line]
    raised = [line.strip() for line in lines if EXCEPTION.match(line.strip())]
    cause = next(iter(asserts or found or raised[-1:]), None)  # the first assert of 1,000 alike
    where = crashed_in(lines)
    where = f" in {where}" if where else ""
    if cause is None:
        return f"{how}{where}"
    return f"{how}: {_SOURCE_FOLDERS.sub('', cause)[:240]}{where}"


def crashed_in(lines: list[str]) -> str:
    """Where the thread that crashed was, from the stacks faulthandler prints on a fatal
    signal (ranks enable it): 'all_reduce (distributed_c10d.py:3068) < ...'; '' if none."""
    text = "\n".join(lines)
    at = text.rfind("Current thread ")
    return innermost(text[at:].split("\n\n")[0], frames=2) if at >= 0 else ""


def last_run_event(log: str) -> Run | None:
    """The run's last `run` event that ended it, from its log's tail; None if there is none."""
    for line in reversed(tail_lines(log)):
        ev = decode(line)
        if isinstance(ev, Run) and ev.status in ("done", "failed", "interrupted"):
            return ev
    return None


def tail_lines(path: str, size: int = 1 << 16) -> list[str]:
    """The last lines of a file (its last `size` bytes), none if it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
