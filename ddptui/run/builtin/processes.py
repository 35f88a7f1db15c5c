"""The rank processes of a run: how one is started (from a fork server, pipes, its files), how
its DataLoader workers are found, and how all of them are ended. Only the supervisor's thread
calls this.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import forkserver, resource_tracker

import psutil

from ddptui.contract.environment import RANK_ONLY_VARIABLES
from ddptui.contract.observe.endings import SELF_INFLICTED, crash_cause, ended_how, tail_lines
from ddptui.contract.options.config import RunConfig
from ddptui.contract.rankspec import RankSpec, run_builtin_rank
from ddptui.contract.states import RankState

TERM_GRACE_S = 3.0  # SIGTERM to SIGKILL
SERVER_TRIES = 3  # a rank's start, when its server dies as it is asked
SERVER_GONE = 255  # the exit code multiprocessing gives a rank whose fork server died
SOCKET_DIR_MAX = 60  # multiprocessing adds /pymp-XXXXXXXX/listener-XXXXXXXX to the temp dir

# What a rank imports before its first step, imported once per run by the fork server every rank
# is forked from, instead of by each rank: torch (1.9 CPU-s), and torch._dynamo (1.7 more),
# which DDP's constructor and the optimizers import. The server is a fresh interpreter (started
# as spawn starts one) that never touches CUDA or runs a thread of Textual's, so forking it is
# as safe as spawning; a rank or a standby is ready seconds sooner, and shares those pages.
RANK_PRELOAD = ["ddptui_trainer.preload"]


@dataclass
class RankProcess:
    """One process started for a rank slot (a slot gets a new process after a stop or crash)."""

    slot: int
    gpu: int | None
    process: mp.process.BaseProcess
    telemetry: object  # read end of this rank's telemetry pipe
    inbox: object  # write end of its command pipe (the world's rank 0 relays commands to all)
    stacks_path: str  # where it writes its Python stacks when sent SIGUSR1
    out_path: str  # its stdout and stderr
    standby: bool = False
    state: RankState = RankState.STARTING
    children: set = field(default_factory=set)  # pids of its DataLoader workers, as seen
    server: int | None = None  # the pid of the fork server it was forked from

    @property
    def alive(self) -> bool:
        return self.process.exitcode is None

    def tell(self, cmd: dict) -> None:
        if self.alive:
            try:
                self.inbox.send(cmd)
            except OSError:  # it died this instant; the sentinel says so next
                pass

    def death(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0 and -code in SELF_INFLICTED:  # a device assert, say
            return crash_cause(code, tail_lines(self.out_path))
        if code == SERVER_GONE and _ending(self.server):
            return "ended with the fork server it was started from, which died (killed?)"
        return ended_how(code)


class ProcessPool:
    """Starts rank processes from the fork server and ends every one of them (and their
    workers) on the way out."""

    def __init__(self, config: RunConfig, log_path: str):
        self.config = config
        self.stem = os.path.splitext(log_path)[0]
        self.procs: list[RankProcess] = []  # every process started, in order
        self.slots: dict[int, RankProcess] = {}  # each rank slot's current process
        self.killed: dict[int, str] = {}  # pid -> why ddptui killed it
        # Plain pipes, no multiprocessing Queue: a Queue's semaphores need the resource tracker
        # (which trips over Textual's stderr and warns about "leaked" locks of killed ranks) and
        # a shared Queue's lock, held by a rank killed mid-send, would silence every rank.
        self._ctx = start_helpers(self.stem + ".tracker.out")

    def start(self, slot: int, gpu: int | None, init: str, standby: bool) -> RankProcess:
        stacks, out = f"{self.stem}.rank{slot}.stacks", f"{self.stem}.rank{slot}.out"
        spec = RankSpec(self.config, slot, slot, self.config.devices.world_size, init, gpu,
                        parent_pid=os.getpid(), output_path=out, stacks_path=stacks,
                        standby=standby, environ=dict(os.environ))
        telemetry, telemetry_end = self._ctx.Pipe(duplex=False)
        inbox_end, inbox = self._ctx.Pipe(duplex=False)
        p = self._ctx.Process(target=run_builtin_rank, args=(spec, telemetry_end, inbox_end),
                              name=f"ddptui-rank{slot}", daemon=False)
        for attempt in range(SERVER_TRIES):
            try:
                p.start()
                break
            except (EOFError, OSError):  # the server died as it was asked (killed?)
                if attempt == SERVER_TRIES - 1:
                    raise
                time.sleep(0.2)  # until it is gone: then a new one starts as the first did
                start_helpers(self.stem + ".tracker.out")
        telemetry_end.close()  # the rank holds these ends; EOF now means it is gone
        inbox_end.close()
        # A rank's status comes through its server, and the rank dies with it
        rp = RankProcess(slot, gpu, p, telemetry, inbox, stacks, out, standby=standby,
                         server=_forkserver_pid())
        self.procs.append(rp)
        self.slots[slot] = rp
        return rp

    def alive(self) -> set[int]:
        """The slots whose current process lives."""
        return {s for s, rp in self.slots.items() if rp.alive}

    def kill(self, slot: int, why: str) -> None:
        """SIGKILL the slot's current process, remembering why (its crash is reported so)."""
        rp = self.slots[slot]
        self.killed[rp.process.pid] = f"killed by ddptui ({why})"
        os.kill(rp.process.pid, signal.SIGKILL)

    def warm_standby(self, slot: int) -> bool:
        """The slot's current process is a standby that is not being killed."""
        rp = self.slots[slot]
        return rp.alive and rp.standby and rp.process.pid not in self.killed

    def drain(self, handle) -> None:
        """Every event the ranks have sent so far, to `handle`; a closed pipe is a gone rank."""
        for r in self.procs:
            try:
                while not r.telemetry.closed and r.telemetry.poll():
                    handle(r.telemetry.recv())
            except (EOFError, OSError):
                r.telemetry.close()

    def pids(self) -> set[int]:
        found = set()
        for r in self.procs:
            if r.process.pid:
                found.add(r.process.pid)
            found |= r.children
        return found

    def scan_children(self) -> None:
        for r in self.procs:
            if r.alive and r.process.pid:
                try:
                    r.children |= {c.pid for c in psutil.Process(r.process.pid).children(True)}
                except psutil.Error:
                    pass

    def end_all(self) -> None:
        """SIGTERM every live rank, SIGKILL what is left, then any worker that outlived its rank.

        Ranks are our children and are reaped through multiprocessing (psutil must not wait on
        them); their DataLoader workers are not, so psutil watches those by pid.
        """
        self.scan_children()
        workers = []
        for pid in {pid for r in self.procs for pid in r.children}:
            try:
                workers.append(psutil.Process(pid))
            except psutil.Error:
                pass
        live = [r.process for r in self.procs if r.alive]
        for p in live:
            p.terminate()
        _join_all(live, TERM_GRACE_S)
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

    def close(self) -> None:
        for r in self.procs:
            r.telemetry.close()
            r.inbox.close()


def _join_all(processes, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))


def prepare_data(config: RunConfig, say: Callable[[str], None]) -> None:
    """Generate the built-in dataset once, with progress, before ranks race for it; in a process
    of its own, as the dashboard never imports the trainer."""
    if config.data.kind != "shapes":
        return
    last = 0.0
    with subprocess.Popen([sys.executable, "-m", "ddptui_trainer.pipeline.shapes"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            done, total = line.split()
            if time.time() - last > 0.5 or done == total:
                last = time.time()
                say(f"generating shapes dataset {done}/{total}")
        error = p.stderr.read().strip()
    if p.returncode != 0:
        raise RuntimeError(f"generating the shapes dataset failed: {error.splitlines()[-1:]}")


def end_helpers() -> None:
    """End multiprocessing's resource tracker and the ranks' fork server and wait for them, once
    a run is over and the process is about to exit; left alone they end only after we do (the
    end of a pipe is their signal), orphans for a moment. The server holds nothing by then and
    is killed: its interpreter took about a second to unload torch. The tracker is told by its
    pipe: the parent registers nothing with it (pipes, no Queues), so closing our end is safe
    here. No process may be started after this."""
    helpers = [(p, " ".join(_cmdline(p))) for p in psutil.Process().children()]
    servers = [p for p, cmdline in helpers if "forkserver" in cmdline]
    trackers = [p for p, cmdline in helpers if "resource_tracker" in cmdline]
    for p in servers:
        try:
            p.kill()
        except psutil.Error:
            pass
    if trackers:
        os.close(resource_tracker.getfd())
    _, left = psutil.wait_procs(servers + trackers, timeout=5)
    for p in left:
        p.kill()


def _ending(server: int | None, within: float = 1.0) -> bool:
    """Whether the fork server is gone, or goes within `within` s: a dying process closes its
    sockets (which gives its ranks their exit code) before it becomes a zombie, and a rank's
    death read in between was reported as a bare "exited with code 255" (1 run in 7 of a test
    beside others)."""
    deadline = time.monotonic() + within
    while _running(server):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _running(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def is_helper(p: psutil.Process) -> bool:
    cmdline = " ".join(_cmdline(p))
    return "resource_tracker" in cmdline or "forkserver" in cmdline


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def start_helpers(path: str) -> mp.context.BaseContext:
    """Start multiprocessing's resource tracker and the fork server ranks are started from, with
    their stderr in a file; returns the context that starts ranks.

    They inherit fd 2: on the terminal the tracker's warnings about the named semaphores of a
    rank we had to kill, or a warning of an import in the server, would garble the one-line
    error promise and the dashboard. And they must start before Textual runs, since starting
    asks sys.stderr for a file descriptor. A server already running (a second run in this
    process) is kept. The server's environment lacks what would make its import of torch start
    CUDA (RANK_ONLY_VARIABLES: each rank gets the whole environment as it starts).
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(RANK_PRELOAD)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved, tempdir = os.dup(2), tempfile.tempdir
    rank_only = {name: os.environ.pop(name) for name in RANK_ONLY_VARIABLES if name in os.environ}
    # The server listens on a Unix socket in a folder of the temp dir, and such a path has at
    # most 107 bytes: a long TMPDIR (a test's, a job's) failed the start ("AF_UNIX path too long")
    if len(tempfile.gettempdir()) > SOCKET_DIR_MAX and os.path.isdir("/tmp"):
        tempfile.tempdir = "/tmp"
    try:
        os.dup2(fd, 2)
        resource_tracker.ensure_running()
        forkserver.ensure_running()
    finally:
        os.environ.update(rank_only)
        tempfile.tempdir = tempdir
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    return ctx


def _forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing fork server (a private attribute of
    `multiprocessing.forkserver`: no public API names it)."""
    return forkserver._forkserver._forkserver_pid
