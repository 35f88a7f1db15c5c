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

from ddptui.contract.observe.streams import Route
from ddptui.contract.safe_text import keep_colours, plain

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

    def finish(self) -> list[str]:
        """At the end of the stream: its last line, if it had no newline."""
        last = _latest(self._partial + self._decoder.decode(b"", final=True))
        self._partial = ""
        return [last] if last else []


def _latest(line: str) -> str:
    """What a terminal shows of a line redrawn with \\r: its last non-empty segment, its
    colours kept (every other escape sequence and control character removed)."""
    segments = [s for s in line.split("\r") if plain(s).strip()]
    return keep_colours(segments[-1]).strip() if segments else ""


class Console:
    """The terminal or pipes that the ranks' output goes on to, shared by their readers: each
    hands it whole lines, so the lines of two ranks never merge. A line being redrawn (a
    progress bar) goes at once; another rank's line then starts on a line of its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[tuple[int, int], object] = {}  # by file: whose unfinished line is there

    def write(self, fd: int, data: bytes, who: object) -> None:
        if not data:
            return
        with self._lock:
            where = _file_of(fd)  # stdout and stderr on one terminal are one screen
            if self._open.get(where) not in (None, who):
                data = b"\n" + data
            self._open[where] = who if not data.endswith(b"\n") else None
            _write_all(fd, data)

    def end(self, fd: int, who: object) -> None:
        """`who` wrote its last: a line of its left unfinished is ended."""
        with self._lock:
            where = _file_of(fd)
            if self._open.get(where) is who:
                self._open[where] = None
                _write_all(fd, b"\n")


def _file_of(fd: int) -> tuple[int, int]:
    try:
        st = os.fstat(fd)
    except OSError:
        return (-1, fd)
    return (st.st_dev, st.st_ino)


class StreamReader(threading.Thread):
    """Reads one pipe (a rank's stdout or stderr) until EOF."""

    def __init__(self, fd: int, out_path: str | None, route: Route, echo: int,
                 colours_only: bool, on_line: Callable[[str, bool], None], name: str,
                 console: Console | None = None):
        """`on_line(text, final)`: a finished line (final) or a progress line's latest state.
        `out_path`: the file that keeps it all (None: none). `route`: whether the bytes go on
        to `echo` (headless: our stdout or stderr), and to which file besides: through the
        `console` the ranks share, whole lines (after a prefix: torchrun's --tee), or, with no
        console, as they come; escape sequences other than colours are removed on the way when
        `colours_only` (a terminal)."""
        super().__init__(name=name, daemon=True)
        self.fd, self.out_path, self.route, self.echo = fd, out_path, route, echo
        self.colours_only, self.console = colours_only, console
        self.on_line = on_line
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)

    def run(self) -> None:
        lines = Lines()
        # Both streams append to one file: each chunk is one write, as a terminal would mix them.
        files = [os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                 for path in (self.out_path, self.route.file) if path]
        held = b""  # for the console: the end of a line not finished yet
        try:
            while data := os.read(self.fd, CHUNK):
                for f in files:
                    _write_all(f, data)
                held = self._pass_on(held + data)
                done, live = lines.feed(data)
                for line in done:
                    self.tail.append(plain(line))
                    self.on_line(line, True)
                if live:
                    self.on_line(live, False)
            for line in lines.finish():  # its last line had no newline
                self.tail.append(plain(line))
                self.on_line(line, True)
            if held:
                self._pass_on(held + b"\n")
        except OSError:
            pass
        finally:
            if self.console is not None and self.route.console:
                self.console.end(self.echo, self)
            os.close(self.fd)
            for f in files:
                os.close(f)

    def _pass_on(self, data: bytes) -> bytes:
        """Show what of `data` can go on now; returns what is held back: the end of a line,
        except one being redrawn (a prefixed line waits for its end whatever it is)."""
        if self.console is None and self.route.prefix is None:
            self._show(data)
            return b""
        cut = data.rfind(b"\n") + 1
        if len(data) - cut > CHUNK:  # no newline for long: not a line of text, it goes as it is
            cut = len(data)
        if self.route.prefix is None:
            if b"\r" in data[cut:]:
                cut = len(data)
            self._show(data[:cut])
        else:
            self._show(b"".join(self.route.prefix + line + b"\n"
                                for line in data[:cut].split(b"\n")[:-1]))
        return data[cut:]

    def _show(self, data: bytes) -> None:
        if not data or not self.route.console:
            return
        if self.colours_only:
            data = keep_colours(data.decode("utf-8", "replace")).encode()
        if self.console is None:
            _write_all(self.echo, data)
        else:
            self.console.write(self.echo, data, self)


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:  # our own stdout closed (a pipe whose reader left): the file keeps it all
        pass


EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b(?::|$)")


def last_traceback(lines: list[str], keep: int = 8) -> list[str]:
    """The last lines of the last Python traceback among `lines`, up to its exception's line
    (a launcher's report that follows it, torchrun's, is not the traceback), or the last
    non-empty lines when there is none."""
    # torch.distributed's excepthook prefixes every line of a rank's traceback with [rankN]:
    lines = [_RANK_PREFIX.sub("", line) for line in lines]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    body = lines[starts[-1]:] if starts else lines
    body = [line for line in body if line.strip()]
    raised = [i for i, line in enumerate(body) if EXCEPTION.match(line.strip())]
    if starts and raised:
        body = body[:raised[-1] + 1]
    return body[-keep:]
