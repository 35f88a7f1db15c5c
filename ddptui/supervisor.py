"""The supervisor: spawns one process per rank, owns every process it started, and keeps the run
state; one thread polls telemetry, process sentinels and commands, decides and acts.
"""

from __future__ import annotations

import enum
import multiprocessing as mp
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.connection import wait as wait_any

import psutil

from ddptui.runstate import RunState
from ddptui.telemetry import PARENT, JsonlWriter, event
from trainer.config import RunConfig

STOP_GRACE_S = 20.0  # agreed stop, final checkpoint and exit; then SIGTERM
TERM_GRACE_S = 3.0  # SIGTERM to SIGKILL
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class RankState(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    CRASHED = "crashed"
    RESTARTING = "restarting"
    DONE = "done"


@dataclass
class RankProcess:
    rank: int
    gpu: int | None
    process: mp.process.BaseProcess
    telemetry: object  # read end of this rank's telemetry pipe
    inbox: object  # write end of its command pipe (rank 0 relays commands to all)
    state: RankState = RankState.STARTING
    children: set = field(default_factory=set)  # pids of its DataLoader workers, as seen


def free_port() -> int:
    """A loopback port nobody listens on now (the rendezvous; a busy port is never our failure)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_log_path() -> str:
    return os.path.join("runs", time.strftime("%Y-%m-%dT%H-%M-%S") + ".jsonl")


class Supervisor:
    """Start with start(); steer with pause()/resume()/checkpoint()/change_settings()/stop();
    wait() returns the exit code. Only this class starts or kills processes."""

    live = True  # there are ranks to steer (a Replay has none)

    def __init__(self, config: RunConfig, log_path: str | None = None):
        self.config = config
        self.log_path = log_path or config.log or default_log_path()
        self.state = RunState({
            "model": config.model, "data": config.data, "epochs": config.epochs,
            "world_size": config.world_size, "device_kind": config.device_kind,
            "gpus": list(config.gpus or []), "batch_size": config.batch_size,
            "log": self.log_path, "checkpoint_dir": config.checkpoint_dir,
        })
        self.ranks: list[RankProcess] = []
        self.exit_code: int | None = None
        self.done = threading.Event()
        self._commands: queue.Queue = queue.Queue()
        self._stop_requested: tuple[str, int] | None = None
        self._stop_deadline: float | None = None
        self._failure: tuple[int, str] | None = None
        self._usage_error: str | None = None
        self._errors: dict[int, str] = {}  # rank -> its last error message
        self._writer: JsonlWriter | None = None
        self._thread = threading.Thread(target=self._main, name="supervisor", daemon=True)
        # Plain pipes, no multiprocessing Queue: a Queue's semaphores need the resource tracker
        # (which trips over Textual's stderr and warns about "leaked" locks of killed ranks) and
        # a shared Queue's lock, held by a rank killed mid-send, would silence every rank.
        self._ctx = mp.get_context("spawn")
        self._start_resource_tracker(os.path.splitext(self.log_path)[0] + ".tracker.out")

    # -- the API the app, the headless console and tests use ---------------------------------
    def start(self) -> None:
        self._writer = JsonlWriter(self.log_path)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.exit_code

    def pause(self) -> None:
        self._commands.put({"op": "pause"})

    def resume(self) -> None:
        self._commands.put({"op": "resume"})

    def checkpoint(self) -> None:
        self._commands.put({"op": "checkpoint"})

    def change_settings(self, **settings) -> None:
        """Ask for new input-pipeline settings; every rank applies them at the next epoch."""
        self.state.apply(event("settings", PARENT, settings=settings, status="requested"))
        self._commands.put({"op": "settings", "settings": settings})

    def stop(self, status: str = "interrupted", code: int = EXIT_INTERRUPTED) -> None:
        """Orderly end: ranks agree on a step, checkpoint if a directory is set, and exit.
        A second call while stopping ends every process at once."""
        self._commands.put({"op": "stop", "status": status, "code": code})

    def pids(self) -> set[int]:
        """Every process of the run seen so far: ranks and their workers."""
        found = set()
        for r in self.ranks:
            if r.process.pid:
                found.add(r.process.pid)
            found |= r.children
        return found

    @staticmethod
    def _start_resource_tracker(path: str) -> None:
        """Start multiprocessing's resource tracker (spawn needs it) with its stderr in a file.

        It inherits fd 2: on the terminal its warnings about the named semaphores of a rank we
        had to kill would garble the one-line error promise and the dashboard. And it must start
        before Textual runs, since it also asks sys.stderr for a file descriptor.
        """
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        saved = os.dup(2)
        try:
            os.dup2(fd, 2)
            resource_tracker.ensure_running()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(fd)

    # -- the supervisor thread -----------------------------------------------------------------
    def _emit(self, kind: str, **fields) -> None:
        self._handle(event(kind, PARENT, **fields))

    def _handle(self, ev: dict) -> None:
        self.state.apply(ev)
        if self._writer:
            self._writer.write(ev)
        if ev["kind"] == "message" and ev.get("level") == "error":
            self._errors[ev["rank"]] = ev.get("text", "")
            if ev.get("usage") and self._usage_error is None:
                self._usage_error = ev.get("text", "bad input")
        if ev["kind"] == "rank" and ev.get("state") == "running":
            rp = self._by_rank(ev["rank"])
            if rp:
                rp.state = RankState.RUNNING

    def _main(self) -> None:
        code = EXIT_FAILED
        try:
            self._emit("run", status="started", pid=os.getpid(), **self.state.meta)
            self._prepare_data()
            if self._stop_requested is None:
                self._spawn()
                self._loop()
            code, status, reason = self._outcome()
            self._emit("run", status=status, exit_code=code, reason=reason,
                       seconds=round(time.time() - (self.state.started_t or time.time()), 2),
                       best_val_acc=self.state.best_val_acc)
        except Exception as e:  # a bug of ours: still end every process and say why
            self._emit("run", status="failed", exit_code=EXIT_FAILED,
                       reason=f"supervisor error: {type(e).__name__}: {e}")
            raise
        finally:
            self._end_all()
            self._drain_telemetry()
            self._close_pipes()
            if self._writer:
                self._writer.close()
            self.exit_code = code if self.exit_code is None else self.exit_code
            self.done.set()

    def _prepare_data(self) -> None:
        """Generate the built-in dataset here, once, with progress, before ranks race for it."""
        if self.config.data_kind != "shapes":
            return
        from trainer.shapes import ensure_shapes

        last = [0.0]

        def progress(done: int, total: int) -> None:
            if time.time() - last[0] > 0.5 or done == total:
                last[0] = time.time()
                self._emit("message", level="info", text=f"generating shapes dataset {done}/{total}")

        ensure_shapes(progress)

    def _spawn(self) -> None:
        from trainer.bootstrap import RankSpec, run_rank

        world = self.config.world_size
        init = f"tcp://127.0.0.1:{free_port()}"
        stem = os.path.splitext(self.log_path)[0]
        gpus = list(self.config.gpus) if self.config.gpus else [None] * world
        self._emit("message", level="info", text=f"starting {world} ranks")
        for rank, gpu in enumerate(gpus):
            spec = RankSpec(self.config, rank, world, init, gpu, os.getpid(),
                            f"{stem}.rank{rank}.out")
            telemetry, telemetry_end = self._ctx.Pipe(duplex=False)
            inbox_end, inbox = self._ctx.Pipe(duplex=False)
            p = self._ctx.Process(target=run_rank, args=(spec, telemetry_end, inbox_end),
                                  name=f"ddptui-rank{rank}", daemon=False)
            p.start()
            telemetry_end.close()  # the rank holds these ends; EOF now means it is gone
            inbox_end.close()
            self.ranks.append(RankProcess(rank, gpu, p, telemetry, inbox))
            self._handle(event("rank", rank, state="starting", pid=p.pid, gpu=gpu,
                               device=f"cuda:{gpu}" if gpu is not None else "cpu"))
        self._emit("world", size=world, ranks=list(range(world)))

    def _loop(self) -> None:
        next_scan = 0.0
        while any(r.process.exitcode is None for r in self.ranks):
            readers = [r.telemetry for r in self.ranks if not r.telemetry.closed]
            sentinels = [r.process.sentinel for r in self.ranks if r.process.exitcode is None]
            wait_any(readers + sentinels, timeout=0.1)
            self._drain_telemetry()
            self._reap()
            self._run_commands()
            now = time.monotonic()
            if now >= next_scan:
                self._scan_children()
                self._sample_host()
                next_scan = now + 1.0
            if self._stop_deadline and now > self._stop_deadline:
                self._emit("message", level="warning",
                           text="ranks did not stop in time: terminating them")
                self._end_all()
        self._reap()

    def _drain_telemetry(self) -> None:
        for r in self.ranks:
            try:
                while not r.telemetry.closed and r.telemetry.poll():
                    self._handle(r.telemetry.recv())
            except (EOFError, OSError):
                r.telemetry.close()

    def _reap(self) -> None:
        for r in self.ranks:
            code = r.process.exitcode
            if code is None or r.state in (RankState.DONE, RankState.CRASHED, RankState.STOPPED):
                continue
            self._drain_telemetry()
            if code == 0:
                r.state = RankState.STOPPED if self._stop_requested else RankState.DONE
                self._emit_rank(r, r.state.value, "")
            elif code == EXIT_USAGE:
                r.state = RankState.STOPPED
                self._emit_rank(r, "stopped", self._usage_error or "bad input")
                self._fail(EXIT_USAGE, self._usage_error or "bad input")
            elif self._failure or self._stop_requested:  # we ended it
                r.state = RankState.STOPPED
                self._emit_rank(r, "stopped", "ended by ddptui")
            else:
                r.state = RankState.CRASHED
                reason = self._death_reason(r, code)
                self._emit_rank(r, "crashed", reason)
                self._fail(EXIT_FAILED, f"rank {r.rank} {reason}")

    def _emit_rank(self, r: RankProcess, state: str, reason: str) -> None:
        self._handle(event("rank", r.rank, state=state, pid=r.process.pid, gpu=r.gpu,
                           reason=reason, exit_code=r.process.exitcode))

    def _death_reason(self, r: RankProcess, code: int) -> str:
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return self._errors.get(r.rank) or f"exited with code {code}"

    def _fail(self, code: int, reason: str) -> None:
        """In this version a lost rank ends the run: the others are ended, cleanly and at once."""
        if self._failure is None and self._stop_requested is None:
            self._failure = (code, reason)
            self._end_all()

    def _run_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd["op"] == "stop":
                self._begin_stop(cmd["status"], cmd["code"])
            else:
                self._send(cmd)

    def _send(self, cmd: dict) -> None:
        # Rank 0 is the authority: it offers commands to every rank at an agreed step.
        leader = next((r for r in self.ranks if r.process.exitcode is None), None)
        if leader is not None:
            try:
                leader.inbox.send(cmd)
            except OSError:  # it died this instant; the sentinel says so next
                pass

    def _close_pipes(self) -> None:
        for r in self.ranks:
            r.telemetry.close()
            r.inbox.close()

    def _begin_stop(self, status: str, code: int) -> None:
        if self._stop_requested is not None:  # asked twice: no more waiting
            self._end_all()
            return
        self._stop_requested = (status, code)
        self._emit("message", level="info", text="stopping: ranks finish their step"
                   + (" and checkpoint" if self.config.checkpoint_dir else ""))
        if any(r.state == RankState.RUNNING for r in self.ranks) and self.state.first_step_t:
            self._send({"op": "stop"})
            self._stop_deadline = time.monotonic() + STOP_GRACE_S
        else:  # still starting up: nothing to save, nothing to agree on
            self._end_all()

    def _outcome(self) -> tuple[int, str, str]:
        if self._failure:
            code, reason = self._failure
            return code, "failed", reason
        if self._stop_requested:
            status, code = self._stop_requested
            return code, status, ""
        if self.ranks and all(r.state == RankState.DONE for r in self.ranks):
            return EXIT_OK, "done", ""
        return EXIT_FAILED, "failed", "ranks ended unexpectedly"

    def _sample_host(self) -> None:
        mem = psutil.virtual_memory()
        self.state.set_host({"cpu_percent": psutil.cpu_percent(), "mem_percent": mem.percent,
                             "mem_used": (mem.total - mem.available) >> 20,
                             "mem_total": mem.total >> 20, "cpus": psutil.cpu_count()})

    def _scan_children(self) -> None:
        for r in self.ranks:
            if r.process.exitcode is None and r.process.pid:
                try:
                    r.children |= {c.pid for c in psutil.Process(r.process.pid).children(True)}
                except psutil.Error:
                    pass

    def _end_all(self) -> None:
        """SIGTERM every live rank, SIGKILL what is left, then any worker that outlived its rank.

        Ranks are our children and are reaped through multiprocessing (psutil must not wait on
        them); their DataLoader workers are not, so psutil watches those by pid.
        """
        self._scan_children()
        workers = []
        for pid in {pid for r in self.ranks for pid in r.children}:
            try:
                workers.append(psutil.Process(pid))
            except psutil.Error:
                pass
        live = [r.process for r in self.ranks if r.process.exitcode is None]
        for p in live:
            p.terminate()
        deadline = time.monotonic() + TERM_GRACE_S
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in live:
            if p.exitcode is None:
                p.kill()
                p.join(TERM_GRACE_S)
        for w in workers:
            try:
                w.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(workers, timeout=TERM_GRACE_S)
        self._stop_deadline = None

    def _by_rank(self, rank: int) -> RankProcess | None:
        return next((r for r in self.ranks if r.rank == rank), None)
