"""Corrupt or unreadable samples: the dataset skips them (the next good sample takes the place)
and notes each one in a small file its DataLoader workers append to; the rank reads the notes
when it reports, names each file once and counts them per epoch.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections import Counter
from collections.abc import Callable

from ddptui.contract.options.errors import DataError

MAX_SKIP = 100  # unreadable samples in a row before the data set itself is the problem


class BadSample(Exception):
    """One sample cannot be read or decoded; the message says why."""


def first_readable(load: Callable[[int], object], index: int, count: int, epoch: int,
                   name: Callable[[int], str], notes: str | None):
    """load(index), or load() of the next good sample after it. Each bad one is noted in the
    `notes` file; without one (--max-bad-samples 0) the first is an error, as it always was."""
    for i in range(index, index + MAX_SKIP):
        i %= count
        try:
            return load(i)
        except BadSample as e:
            skip(notes, epoch, name(i), str(e))
    raise DataError(f"{MAX_SKIP} unreadable samples in a row from {name(index)}")


def skip(notes: str | None, epoch: int, name: str, why: str) -> None:
    """Note a bad sample in the `notes` file (a worker's, or the rank's codec); without one
    (--max-bad-samples 0) it is an error."""
    if notes is None:
        raise DataError(f"corrupt or unreadable sample {name}: {why}")
    _note(notes, epoch, name, why)


def _note(path: str, epoch: int, name: str, why: str) -> None:
    line = "\t".join((str(epoch), name.replace("\t", " "), why.replace("\n", " "))) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())  # one write on O_APPEND: workers' lines never interleave
    finally:
        os.close(fd)


class BadSamples:
    """The rank's side of the notes: read() returns the samples not named before."""

    def __init__(self, limit: int):
        self.limit = limit
        # Made by the first note: a rank killed outright (nothing of it runs close()) leaves a
        # file behind only where it did meet a bad sample.
        self.path = os.path.join(tempfile.gettempdir(),
                                 f"ddptui-bad-{os.getpid()}-{secrets.token_hex(4)}.tsv")
        self.notes = self.path if limit > 0 else None
        self.seen: dict[str, str] = {}  # file -> why
        self.per_epoch: Counter = Counter()
        self._offset = 0

    def read(self) -> list[tuple[str, str]]:
        """(file, why) for each sample skipped for the first time since the last read."""
        if self.notes is None or self._size() <= self._offset:  # a stat at each report
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        new = []
        for line in complete.decode(errors="replace").splitlines():
            epoch, name, why = line.split("\t", 2)
            self.per_epoch[int(epoch)] += 1
            if name not in self.seen:
                self.seen[name] = why
                new.append((name, why))
        return new

    def _size(self) -> int:
        try:
            return os.path.getsize(self.path)
        except FileNotFoundError:  # nothing noted yet
            return 0

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
