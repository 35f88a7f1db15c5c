"""A run's event log on disk: written whole lines only, read back skipping what does not parse.
"""

from __future__ import annotations

import contextlib
import errno
import os

from ddptui.contract.protocol.codec import decode, encode, event_of, parse
from ddptui.contract.protocol.events import Event


class JsonlWriter:
    """Appends events to a file; each line is one write() on an O_APPEND descriptor, so several
    ranks of a torchrun launch can share one log without tearing lines."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.failed: str | None = None  # why a line could not be written, once one could not

    def write(self, ev: Event, last: bool = False) -> bool:
        """Append `ev` as one whole line; False where it could not be (a full disk): nothing of
        it is left in the file, and the log takes no more lines after that, but a `last` one
        (the run's end, where it still fits)."""
        if self.failed and not last:
            return False
        data = encode(ev).encode()
        size = -1
        try:
            size = os.fstat(self._fd).st_size
            if os.write(self._fd, data) == len(data):
                return True
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # cut short: the disk filled
        except OSError as e:
            self.failed = self.failed or e.strerror or str(e)
            if size >= 0:  # no torn line: the file ends with the last whole one
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, size)
            return False

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_events(path: str) -> list[Event]:
    """All valid events of a log, in file order."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [ev for ev in map(decode, f) if ev is not None]


def read_records(path: str) -> list[dict]:
    """The log as its JSON objects (for tools that read the log's lines): each line that
    decodes to an event, as written."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [obj for obj in map(parse, f) if obj is not None and event_of(obj) is not None]
