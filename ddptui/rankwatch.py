"""What `python -m ddptui.wrap` sends `ddptui attach` from inside a rank it wraps: the rank and
its node, its output (passed through unchanged, read line by line for loss), its process and
GPU figures, its Python stacks and NCCL flight recorder when attach asks, its exception.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

import psutil

from ddptui.script.flight import DUMP_WAIT_S, FlightDumps, compact, summary, trace_env
from ddptui.script.metrics import MetricReader, compile_metrics
from ddptui.script.output import LINE_EVERY_S, StreamReader
from ddptui.script.streams import Route
from ddptui.view.text import plain
from trainer.protocol.channel import load_key, parse_address
from trainer.protocol.events import event
from trainer.telemetry.gpu import DeviceSampler, physical_index
from trainer.telemetry.remote import RemoteLink, node_name

SAMPLE_EVERY_S = 1.0  # the process's figures, as ddptui run samples a script's ranks
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
        self.link = RemoteLink(parse_address(report, "DDPTUI_REPORT"), load_key()[0],
                               node_name(), lambda text: print(f"ddptui.wrap: rank {rank}: "
                                                               f"{text}", file=sys.stderr))
        self._lock = threading.Lock()  # the tees, the sampler and the command thread emit
        self.reader = MetricReader(rank, compile_metrics(), self._emit_figure)
        self._line: tuple[str, bool] | None = None
        self._line_t = 0.0
        self._halt = threading.Event()
        self.gpu = _physical_gpu(local_rank)
        self.device = DeviceSampler(lambda kind, **f: self.emit(kind, **f),
                                    lambda text: self.emit("message", level="warning", text=text),
                                    self.gpu)
        self.tees: list[Tee] = []
        self._lines: list[str] = []  # whole lines not sent yet (attach keeps them per rank)
        self._dropped = 0
        self.flight, self._trace_dir = _flight_recorder()

    def start(self, label: str) -> None:
        self.emit("rank", state="running", pid=os.getpid(), host=socket.gethostname(),
                  gpu=self.gpu, device=f"GPU {self.gpu}" if self.gpu is not None else "cpu",
                  api="ddptui.wrap", local_rank=self.local_rank)
        if self.rank == 0:
            self.emit("run", status="started", model=label, script=" ".join(sys.argv), data="",
                      epochs=0, world_size=self.world_size,
                      device_kind="cuda" if self.gpu is not None else "cpu")
        self.tees = [Tee(fd, self._on_line) for fd in (1, 2)]
        self.device.start()
        threading.Thread(target=self._sample, name="ddptui-wrap-sampler", daemon=True).start()
        threading.Thread(target=self._commands, name="ddptui-wrap-commands", daemon=True).start()

    def emit(self, kind: str, **fields) -> None:
        with self._lock:
            self.link.put(event(kind, self.rank, **fields))

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
            self.emit("output", text=line[0], final=line[1])

    def _send_lines(self) -> None:
        with self._lock:
            lines, dropped, self._lines, self._dropped = self._lines, self._dropped, [], 0
        if lines or dropped:
            self.emit("lines", lines=lines, **({"dropped": dropped} if dropped else {}))

    def _emit_figure(self, kind: str, **fields) -> None:  # under self._lock already
        self.link.put(event(kind, self.rank, **fields))

    def _sample(self) -> None:
        me = psutil.Process()
        me.cpu_percent()  # psutil's first reading is meaningless
        while not self._halt.wait(SAMPLE_EVERY_S):
            self._send_line(time.monotonic())
            self._send_lines()
            with self._lock:
                self.reader.flush()
            try:
                with me.oneshot():
                    self.emit("process", pid=me.pid, status=me.status(),
                              cpu_percent=me.cpu_percent(), rss=me.memory_info().rss >> 20)
            except psutil.Error:
                pass

    # -- what attach asks ------------------------------------------------------------------
    def _commands(self) -> None:
        try:
            while True:
                cmd = self.link.inbox.recv()
                if cmd.get("op") == "stacks":
                    stacks = _stacks()
                    self.emit("message", level="info", text=f"rank {self.rank}'s stacks",
                              stacks_of=self.rank, stacks=stacks)
                    if self.flight is not None and self.flight.ask(self.rank, time.monotonic()):
                        threading.Thread(target=self._send_flight, args=(stacks,), daemon=True,
                                         name="ddptui-wrap-flight").start()
                elif cmd.get("op") == "kill":  # k in attach: the launcher does the rest
                    os.kill(os.getpid(), signal.SIGKILL)
        except EOFError:
            pass

    def _send_flight(self, stacks: str) -> None:
        """The flight recorder's dump, once torch's watchdog has written it: where this rank is
        in NCCL, shown above its stacks, and the little attach needs to blame across nodes."""
        deadline = time.monotonic() + DUMP_WAIT_S + 1
        while time.monotonic() < deadline:
            for _, trace in self.flight.collect(time.monotonic()):
                nccl = summary(trace)
                if nccl is not None:
                    self.emit("message", level="info", text=f"rank {self.rank}: {nccl}",
                              stacks_of=self.rank, stacks=f"{nccl}\n\n{stacks}",
                              flight=compact(trace))
                return
            time.sleep(0.2)

    # -- the end ---------------------------------------------------------------------------
    def failed(self, exc: BaseException, lines: list[str], code: int) -> None:
        text = f"{type(exc).__name__}: {exc}"
        self.emit("error", text=text, traceback=lines, exit_code=code, pid=os.getpid())
        self.emit("rank", state="crashed", reason=text, exit_code=code, pid=os.getpid())
        if self.rank == 0:
            self.emit("run", status="failed", exit_code=code, reason=f"rank 0: {text}")

    def finished(self, code: int) -> None:
        self.emit("rank", state="done" if code == 0 else "crashed", exit_code=code,
                  pid=os.getpid(), **({} if code == 0 else {"reason": f"exited with code {code}"}))
        if self.rank == 0:
            self.emit("run", status="done" if code == 0 else "failed", exit_code=code)

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
        self.device.stop()
        with self._lock:
            self.reader.finish_epoch(partial=False)
        self._send_line(time.monotonic())
        self._send_lines()
        self.link.close()
        if self._trace_dir is not None:
            shutil.rmtree(self._trace_dir, ignore_errors=True)


def _stacks() -> str:
    """Every thread's Python stack, as faulthandler writes it (from C: the main thread may be
    anywhere)."""
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()


def _flight_recorder() -> tuple[FlightDumps | None, str | None]:
    """torch's NCCL flight recorder turned on for the script's process groups, dumped through
    its pipe in a folder of the rank's own; left alone where the user set it up."""
    _, dump_file, pipe = trace_env("", {})
    if dump_file in os.environ or pipe in os.environ:
        return None, None
    folder = tempfile.mkdtemp(prefix="ddptui-wrap-")
    prefix = os.path.join(folder, "nccl-trace-rank")
    os.environ.update(trace_env(prefix, os.environ))
    return FlightDumps(prefix), folder


def _reporting() -> bool:
    client = sys.modules.get("ddptui.client")
    runs = getattr(client, "_RUN", None) if client is not None else None
    return bool(runs) and runs[0].active


def _physical_gpu(local_rank: int) -> int | None:
    """The GPU this local rank uses by convention (LOCAL_RANK-th visible), if NVML sees one."""
    from ddptui.run.nvml import gpu_count

    if os.environ.get("CUDA_VISIBLE_DEVICES") == "" or not gpu_count():
        return None
    return physical_index(local_rank)
