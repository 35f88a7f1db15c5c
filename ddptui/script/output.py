"""A rank's output as it arrives: written whole to its .out file, passed on as it is (headless,
where torchrun would show it), and cut into lines for the screen and the metric reader, with
carriage-return progress bars (tqdm, Lightning, Hugging Face) collapsed to their latest state.
"""

from __future__ import annotations

import codecs
import os
import re
import threading
from collections import deque
from collections.abc import Callable

from ddptui.script.streams import Route
from ddptui.text import keep_colours, plain

CHUNK = 1 << 16
LINE_EVERY_S = 0.5  # a rank's latest line goes to the log and the screen at most this often
TAIL_LINES = 60  # kept per stream: the last lines of a traceback
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")
# What torch's C++ logging (c10: `[rank0]:[E1126 10:00:00.123 ProcessGroupNCCL.cpp:...]`) and
# NCCL's own (`host:pid:tid [0] NCCL WARN ...`) print: the NCCL watchdog and the flight
# recorder write such lines when ddptui asks a hung rank for its dump, so they are no sign
# that the script moves.
_LIBRARY_LOG = re.compile(r"^(?:\[rank\d+\]: ?)?(?:\[[IWEF]\d{4} \d\d:\d\d:\d\d"
                          r"|\S+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN|TRACE))")


def library_log(line: str) -> bool:
    """Whether a line is torch's or NCCL's own logging rather than the script's output."""
    return _LIBRARY_LOG.match(line) is not None


class Lines:
    """Bytes in, finished lines (and the live state of the line being drawn) out."""

    def __init__(self):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> tuple[list[str], str]:
        """(lines finished by this chunk, the unfinished line's latest state: '' if none),
        colours kept. A line redrawn with \\r counts as what it last showed."""
        text = self._partial + self._decoder.decode(data)
        *done, self._partial = text.split("\n")
        # An unfinished line is news only when it is being redrawn (a progress bar); else it
        # is a write cut short, whose rest follows.
        live = _latest(self._partial) if "\r" in self._partial else ""
        return [_latest(line) for line in done], live


def _latest(line: str) -> str:
    """What a terminal shows of a line redrawn with \\r: its last non-empty segment, its
    colours kept (every other escape sequence and control character removed)."""
    segments = [s for s in line.split("\r") if plain(s).strip()]
    return keep_colours(segments[-1]).strip() if segments else ""


class StreamReader(threading.Thread):
    """Reads one pipe (a rank's stdout or stderr) until EOF."""

    def __init__(self, fd: int, out_path: str | None, route: Route, echo: int,
                 colours_only: bool, on_line: Callable[[str, bool], None], name: str):
        """`on_line(text, final)`: a finished line (final) or a progress line's latest state.
        `out_path`: the file that keeps it all (None: none). `route`: whether the bytes go on
        to `echo` (headless: our stdout or stderr) as they come, or line by line after a prefix
        (torchrun's --tee), and to which file besides; escape sequences other than colours are
        removed on the way when `colours_only` (a terminal)."""
        super().__init__(name=name, daemon=True)
        self.fd, self.out_path, self.route, self.echo = fd, out_path, route, echo
        self.colours_only = colours_only
        self.on_line = on_line
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)

    def run(self) -> None:
        lines = Lines()
        # Both streams append to one file: each chunk is one write, as a terminal would mix them.
        files = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                 for path in (self.out_path, self.route.file) if path]
        pending = b""  # of a prefixed console: the line not finished yet
        try:
            while data := os.read(self.fd, CHUNK):
                for f in files:
                    _write_all(f, data)
                if self.route.prefix is not None:
                    *whole, pending = (pending + data).split(b"\n")
                    self._show(b"".join(self.route.prefix + line + b"\n" for line in whole))
                elif self.route.console:
                    self._show(data)
                done, live = lines.feed(data)
                for line in done:
                    self.tail.append(plain(line))
                    self.on_line(line, True)
                if live:
                    self.on_line(live, False)
            if pending:
                self._show(self.route.prefix + pending)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            for f in files:
                os.close(f)

    def _show(self, data: bytes) -> None:
        if data and self.route.console:
            _write_all(self.echo, keep_colours(data.decode("utf-8", "replace")).encode()
                       if self.colours_only else data)


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # our own stdout closed (a pipe whose reader left): the file keeps it all
        pass


def last_traceback(lines: list[str], keep: int = 8) -> list[str]:
    """The last lines of the last Python traceback among `lines` (its exception last), or the
    last non-empty lines when there is none."""
    # torch.distributed's excepthook prefixes every line of a rank's traceback with [rankN]:
    lines = [_RANK_PREFIX.sub("", line) for line in lines]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    body = lines[starts[-1]:] if starts else lines
    body = [line for line in body if line.strip()]
    return body[-keep:]
