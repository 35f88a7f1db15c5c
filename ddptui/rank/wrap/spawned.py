"""Inside a script that starts its own ranks (mp.spawn, start_processes, multiprocessing.Process,
a torchrun of its own): each process under the launcher that joins a process group becomes a rank.

Loaded by ddptui's sitecustomize in every process of such a run (DDPTUI_RANKS names the socket
of `ddptui run`'s run; under `ddptui.rank.wrap`, DDPTUI_WRAP_RANKS: each rank reports to attach). It
starts on the standard library alone, since every process (DataLoader workers too) loads it,
and only a process that joins a process group imports more.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import threading
import traceback

from ddptui.contract.protocol.codec import dumps
from ddptui.rank.patching import after_import

SOCKET = "DDPTUI_RANKS"  # the run's Unix socket, where a rank's streams and the ends go
STEM = "DDPTUI_RANKS_STEM"  # runs/<time>: a rank's stacks file is <stem>.rank<N>.stacks
JOINED = "DDPTUI_JOINED"  # set in a rank once it joined: the rank ddptui.init() then reports as
WRAPPED = "DDPTUI_WRAP_RANKS"  # under ddptui.rank.wrap, the job's name: each rank reports to attach


class _Launcher:
    """What the launcher (the process ddptui started) tells the run: each child's end, as its
    own waitpid() learns it (ddptui cannot wait for its grandchildren)."""

    def __init__(self, path: str):
        self.path = path
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()

    def ended(self, pid: int, status: int) -> None:
        try:
            code = os.waitstatus_to_exitcode(status)
        except ValueError:  # stopped, not ended
            return
        line = (dumps({"ended": pid, "code": code}) + "\n").encode()
        with self.lock:
            try:
                if self.sock is None:
                    self.sock = _connect(self.path, {"launcher": os.getpid()})
                self.sock.sendall(line)
            except OSError:  # the run is gone: nobody to tell
                self.sock = None


def _connect(path: str, hello: dict) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall((dumps(hello) + "\n").encode())
    return s


def install(launcher: bool) -> None:
    """In every process of the run: ranks are announced as they join; in the launcher,
    its children's ends are told too (to ddptui run's socket; under attach each rank tells its
    own)."""
    path = os.environ.get(SOCKET)
    if not path and not os.environ.get(WRAPPED):
        return
    global _LAUNCHER
    if launcher:
        _LAUNCHER = os.getpid()
    if launcher and path:
        tell = _Launcher(path)
        waitpid = os.waitpid

        @functools.wraps(waitpid)
        def told_waitpid(pid, options):
            got, status = waitpid(pid, options)
            if got > 0:
                tell.ended(got, status)
            return got, status

        os.waitpid = told_waitpid  # subprocess binds it at import: this runs before
    after_import({"torch.distributed.distributed_c10d": _patch_c10d,
                  "torch.multiprocessing.spawn": _patch_spawn,
                  "multiprocessing.process": _patch_process})


def report_ranks(label: str) -> None:
    """Under `python -m ddptui.rank.wrap` (attach): the script is a launcher, no rank; each process
    it starts reports to attach as the rank it joins as (a spawned one loads the sitecustomize)."""
    from ddptui.contract.environment import with_inject

    os.environ[WRAPPED] = label
    os.environ["PYTHONPATH"] = with_inject(os.environ.get("PYTHONPATH"))
    install(launcher=True)


_LAUNCHER: int | None = None  # the launcher's pid, inherited by its forked children
_WATCH: list = []  # under attach: this process's RankWatch, once it joined
_RAISED: list = []  # the exception mp.spawn's worker raised, for its watch to tell


def _patch_c10d(module) -> None:
    original = module.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        if os.getpid() != _LAUNCHER and os.environ.get(JOINED) is None:
            try:
                _joined(module)
            except Exception as e:  # never the script's failure
                print(f"ddptui: this rank is not shown on its own: {e}", file=sys.stderr)
        return result

    module.init_process_group = init_process_group


def _patch_spawn(module) -> None:
    """mp.spawn's workers hand their exception to the launcher and print nothing: each prints
    it too, on its own stderr, so the rank that raised is the one blamed."""
    original = module._wrap

    def _wrap(fn, i, args, error_file):
        return original(_printing(fn), i, args, error_file)

    _wrap.__module__, _wrap.__qualname__ = original.__module__, original.__qualname__
    module._wrap = _wrap  # pickled by name to a spawned child, which resolves it patched too


def _printing(fn):
    @functools.wraps(fn)
    def run(*args):
        try:
            return fn(*args)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            traceback.print_exc()
            sys.stderr.flush()
            _RAISED.append((e, traceback.format_exc().rstrip("\n").splitlines()[-8:]))
            raise

    return run


def _patch_process(module) -> None:
    """Under attach, a rank's end is its own to tell: when the process's run() returns, raises
    or exits (mp.spawn's worker exits 1 after its exception), before it ends."""
    original = module.BaseProcess.run

    @functools.wraps(original)
    def run(self):
        try:
            original(self)
        except SystemExit as e:
            _told_end(e.code if isinstance(e.code, int) else (0 if e.code is None else 1))
            raise
        except Exception as e:
            _RAISED.append((e, traceback.format_exc().rstrip("\n").splitlines()[-8:]))
            _told_end(1)
            raise
        _told_end(0)

    module.BaseProcess.run = run


def _told_end(code: int) -> None:
    if not _WATCH:
        return
    watch = _WATCH.pop()
    if code and _RAISED:
        exc, lines = _RAISED[-1]
        watch.failed(exc, lines, code)
    else:
        watch.finished(code)
    watch.close()


def _joined(c10d) -> None:
    """This process joined a process group: the run is told who it is (its rank and world
    from the group), gets its stdout and stderr as the rank's own, and its stacks on signal;
    under attach, it reports through a watch of its own."""
    from ddptui.contract.observe.vitals import phases_path, vitals_path
    from ddptui.rank.stacks import answer_stacks
    from ddptui.rank.telemetry.vitals import keep_vitals

    rank, world = c10d.get_rank(), c10d.get_world_size()
    os.environ[JOINED] = str(rank)
    if sys.platform.startswith("linux"):  # it ends with its launcher, as a ddptui rank does
        import ctypes

        ppid = os.getppid()
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != ppid:
            os._exit(1)
    if not os.environ.get(SOCKET):  # under attach: its own watch, as a wrapped rank has
        _watched(rank, world)
        return
    stacks = f"{os.environ.get(STEM, '')}.rank{rank}.stacks"
    open(stacks, "w").close()  # a former rank's are not this one's
    # Appending, as sitecustomize's: ddptui empties the file before each request.
    answer_stacks(int(os.environ.get("DDPTUI_STACKS_SIGNAL", signal.SIGUSR1)), open(stacks, "a"))
    keep_vitals(vitals_path(stacks), phases_path(stacks))
    hello = {"pid": os.getpid(), "rank": rank, "world": world, "gpu": _gpu(),
             "stacks": stacks}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    for fd in (1, 2):
        s = _connect(os.environ[SOCKET], {**hello, "stream": fd})
        os.dup2(s.fileno(), fd)
        s.close()


def _watched(rank: int, world: int) -> None:
    """A RankWatch of its own (ddptui/rank/wrap/rankwatch.py), as the rank it joined as."""
    from ddptui.rank.wrap.rankwatch import RankWatch

    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    local = cuda.current_device() if cuda is not None and cuda.is_initialized() else 0
    watch = RankWatch(os.environ["DDPTUI_REPORT"], rank, local, world)
    watch.start(os.environ[WRAPPED])
    _WATCH.append(watch)


def _gpu() -> int | None:
    """The physical GPU the rank has made current, if it has touched CUDA yet."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    from ddptui.contract.gpu import physical_index  # a rank's: torch is loaded already

    return physical_index(cuda.current_device())
