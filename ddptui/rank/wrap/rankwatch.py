"""What `python -m ddptui.rank.wrap` sends `ddptui attach` from inside a rank it wraps: the rank and
its node, its output (passed through unchanged, read line by line for loss) and its exception,
through the rank's sidecar process (ddptui/rank/wrap/sidecar.py), which holds the link and does what must
work while the rank is stuck: its process and GPU figures, its stacks and NCCL flight recorder.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from ddptui.contract.gpu import physical_index
from ddptui.contract.observe.flight import trace_env
from ddptui.contract.observe.metrics import MetricReader, compile_metrics
from ddptui.contract.observe.output import LINE_EVERY_S, StreamReader
from ddptui.contract.observe.streams import Route
from ddptui.contract.protocol import events
from ddptui.contract.protocol.codec import encode
from ddptui.contract.safe_text import plain
from ddptui.rank.stacks import answer_stacks
from ddptui.rank.telemetry.instrument import clock_on
from ddptui.rank.telemetry.script_watch import Watch, watch_everything
from ddptui.rank.telemetry.vitals import keep_vitals

SEND_EVERY_S = 1.0  # whole lines and figures read from them go out this often
SIDECAR_EXIT_S = 5.0  # at the end: the sidecar sends what it holds (up to 3 s) and exits
# The sidecar imports nothing from the project's folder, which -c (and -m) put first on the path:
# a module of the project's named as one the sidecar imports (psutil.py) would take its place.
SIDECAR = ("import sys; del sys.path[0]; from ddptui.rank.wrap.sidecar import main; "
           "sys.exit(main(sys.argv[1:]))")
LINES_KEPT = 500  # whole lines sent a second at most: a flood is cut, and the cut counted


class Tee:
    """One of the process's own streams (fd 1 or 2) made a pipe, read by a StreamReader that
    passes every byte on to where the stream went and hands each line to `on_line`."""

    def __init__(self, fd: int, on_line):
        self.fd = fd
        self.original = os.dup(fd)
        read, write = os.pipe()
        os.dup2(write, fd)
        os.close(write)
        self.reader = StreamReader(read, None, Route(console=True), self.original, False,
                                   on_line, f"ddptui-tee-{fd}")
        self.reader.start()

    def restore(self) -> None:
        """The stream back where it was; what is still in the pipe is read (children that
        inherited the pipe may keep it open: not waited for long)."""
        os.dup2(self.original, self.fd)
        self.reader.join(1.0)


class RankWatch:
    """Started before the script runs, closed after it, in the rank's own process."""

    def __init__(self, report: str, rank: int, local_rank: int, world_size: int):
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self._lock = threading.Lock()  # the tees and the sender emit
        self.reader = MetricReader(rank, compile_metrics(), self._emit_figure)
        self._line: tuple[str, bool] | None = None
        self._line_t = 0.0
        self._halt = threading.Event()
        self.gpu = _physical_gpu(local_rank)
        self.tees: list[Tee] = []
        self._lines: list[str] = []  # whole lines not sent yet (attach keeps them per rank)
        self._dropped = 0
        self._dir = tempfile.mkdtemp(prefix="ddptui-wrap-")
        flight = _flight_recorder(self._dir)
        stacks = os.path.join(self._dir, "stacks")
        sig = int(os.environ.get("DDPTUI_STACKS_SIGNAL", signal.SIGUSR1))
        # From C, on the sidecar's signal: it answers while this process's Python cannot.
        answer_stacks(sig, open(stacks, "a"))
        vitals = os.path.join(self._dir, "vitals")
        keep_vitals(vitals)
        # The phases of its steps (DDP's, torch.optim's and DataLoader's hooks), sent as events.
        self.steps = watch_everything(rank, self.emit) if clock_on() else Watch(rank, self.emit)
        read, self._out = os.pipe()
        self.sidecar = subprocess.Popen(
            [sys.executable, "-c", SIDECAR, "--report", report, "--rank", str(rank),
             "--pid", str(os.getpid()), "--stacks", stacks, "--signal", str(sig),
             "--vitals", vitals,
             "--events", str(read), "--scratch", self._dir,
             *(["--gpu", str(self.gpu)] if self.gpu is not None else []),
             *(["--flight", flight] if flight else [])], pass_fds=(read,))
        os.close(read)
        # A forked child (a DataLoader worker) would hold the pipe open past the rank's end,
        # and the sidecar waits for its end to send what is left.
        os.register_at_fork(after_in_child=self._forget_pipe)

    def _forget_pipe(self) -> None:
        try:
            os.close(self._out)
        except OSError:
            pass
        self._out = -1

    def start(self, label: str) -> None:
        self.emit(events.Rank(rank=self.rank, state="running", pid=os.getpid(), host=socket.gethostname(),
                  gpu=self.gpu, device=f"GPU {self.gpu}" if self.gpu is not None else "cpu",
                  api="ddptui.rank.wrap", local_rank=self.local_rank))
        if self.rank == 0:
            self.emit(events.Run(rank=self.rank, status="started", model=label,
                                 script=" ".join(sys.argv), data="", epochs=0,
                                 world_size=self.world_size,
                      device_kind="cuda" if self.gpu is not None else "cpu"))
        self.tees = [Tee(fd, self._on_line) for fd in (1, 2)]
        threading.Thread(target=self._send, name="ddptui-wrap-sender", daemon=True).start()

    def emit(self, ev: events.Event) -> None:
        with self._lock:
            self._put(ev)

    def _put(self, ev: events.Event) -> None:  # under self._lock
        data = encode(ev).encode()
        try:  # a signal (the sidecar's for stacks) can cut a long write short: the rest follows
            while data:
                data = data[os.write(self._out, data):]
        except (OSError, ValueError):  # the sidecar is gone: nobody to tell
            pass

    # -- what the rank prints --------------------------------------------------------------
    def _on_line(self, text: str, final: bool) -> None:
        if not _reporting():  # ddptui.init() in the script sends its own steps
            with self._lock:
                self.reader.line(plain(text), final)
        self._line = (text, final)
        if final:
            with self._lock:
                if len(self._lines) < LINES_KEPT:
                    self._lines.append(text)
                else:
                    self._dropped += 1
        now = time.monotonic()
        if now - self._line_t >= LINE_EVERY_S:
            self._send_line(now)

    def _send_line(self, now: float) -> None:
        line, self._line = self._line, None
        if line is not None:
            self._line_t = now
            self.emit(events.Output(rank=self.rank, text=line[0], final=line[1]))

    def _send_lines(self) -> None:
        with self._lock:
            lines, dropped, self._lines, self._dropped = self._lines, self._dropped, [], 0
        if lines or dropped:
            self.emit(events.Lines(rank=self.rank, lines=lines, dropped=dropped or None))

    def _emit_figure(self, ev: events.Event) -> None:  # under self._lock already
        self._put(ev)

    def _send(self) -> None:
        while not self._halt.wait(SEND_EVERY_S):
            self._send_line(time.monotonic())
            self._send_lines()
            with self._lock:
                self.reader.flush()

    # -- the end ---------------------------------------------------------------------------
    def failed(self, exc: BaseException, lines: list[str], code: int) -> None:
        text = f"{type(exc).__name__}: {exc}"
        self.emit(events.Error(rank=self.rank, text=text, traceback=lines, exit_code=code, pid=os.getpid()))
        self.emit(events.Rank(rank=self.rank, state="crashed", reason=text, exit_code=code, pid=os.getpid()))
        if self.rank == 0:
            self.emit(events.Run(rank=self.rank, status="failed", exit_code=code, reason=f"rank 0: {text}"))

    def finished(self, code: int) -> None:
        self.steps.flush()  # its last window
        self.emit(events.Rank(rank=self.rank, state="done" if code == 0 else "crashed", exit_code=code,
                  pid=os.getpid(), reason=None if code == 0 else f"exited with code {code}"))
        if self.rank == 0:
            self.emit(events.Run(rank=self.rank, status="done" if code == 0 else "failed", exit_code=code))

    def close(self) -> None:
        """Flush the streams through the tees, send what is left, and let go of the link."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        for tee in self.tees:
            tee.restore()
        self._halt.set()
        with self._lock:
            self.reader.finish_epoch(partial=False)
        self._send_line(time.monotonic())
        self._send_lines()
        os.close(self._out)  # the sidecar sends what it holds and exits
        try:
            self.sidecar.wait(SIDECAR_EXIT_S)
        except subprocess.TimeoutExpired:
            self.sidecar.kill()
            self.sidecar.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


def _flight_recorder(folder: str) -> str | None:
    """torch's NCCL flight recorder turned on for the script's process groups, dumped through
    its pipe in `folder`; its prefix, or None where the user set it up themselves."""
    _, dump_file, pipe = trace_env("", {})
    if dump_file in os.environ or pipe in os.environ:
        return None
    prefix = os.path.join(folder, "nccl-trace-rank")
    os.environ.update(trace_env(prefix, os.environ))
    return prefix


def _reporting() -> bool:
    api = sys.modules.get("ddptui.rank.api.session")
    runs = getattr(api, "_RUN", None) if api is not None else None
    return bool(runs) and runs[0].active


def _physical_gpu(local_rank: int) -> int | None:
    """The GPU this local rank uses by convention (LOCAL_RANK-th visible), if NVML sees one."""
    from ddptui.contract.nvml import gpu_count

    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" or not gpu_count():
        return None
    return physical_index(local_rank)
