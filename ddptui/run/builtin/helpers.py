"""multiprocessing's helpers that a run's ranks start from: the fork server, which imports what
every rank needs once, and the resource tracker; started with the run, ended with its process.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import tempfile
import time
from multiprocessing import forkserver, resource_tracker

import psutil

from ddptui.contract.environment import RANK_ONLY_VARIABLES

SOCKET_DIR_MAX = 60  # multiprocessing adds /pymp-XXXXXXXX/listener-XXXXXXXX to the temp dir

# What a rank imports before its first step, imported once per run by the fork server every rank
# is forked from, instead of by each rank: torch (1.9 CPU-s), and torch._dynamo (1.7 more),
# which DDP's constructor and the optimizers import. The server is a fresh interpreter (started
# as spawn starts one) that never touches CUDA or runs a thread of Textual's, so forking it is
# as safe as spawning; a rank or a standby is ready seconds sooner, and shares those pages.
RANK_PRELOAD = ["ddptui_trainer.preload"]


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


def ending(server: int | None, within: float = 1.0) -> bool:
    """Whether the fork server is gone, or goes within `within` s: a dying process closes its
    sockets (which gives its ranks their exit code) before it becomes a zombie, and a rank's
    death read in between was reported as a bare "exited with code 255"."""
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
        _forget_a_gone_server()
        forkserver.ensure_running()
    finally:
        os.environ.update(rank_only)
        tempfile.tempdir = tempdir
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
    return ctx


def _forget_a_gone_server() -> None:
    """multiprocessing starts its fork server again where it died, unless another waiter reaped
    it first (psutil's, after a kill): then it raises ChildProcessError. Such a server is
    forgotten here, as multiprocessing forgets one it reaps, and a new one starts."""
    server = forkserver._forkserver
    if server._forkserver_pid is None:
        return
    try:
        gone, _ = os.waitpid(server._forkserver_pid, os.WNOHANG)
    except ChildProcessError:
        gone = server._forkserver_pid
    if gone:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = server._forkserver_pid = None  # (a new one, a new address)


def forkserver_pid() -> int | None:
    """The pid of this process's multiprocessing fork server (a private attribute of
    `multiprocessing.forkserver`: no public API names it)."""
    return forkserver._forkserver._forkserver_pid
