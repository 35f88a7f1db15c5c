"""The run's side of a script that starts its own ranks: the socket each rank's streams come in
on (with who it is) and the launcher's word on its children's ends, and a rank's process as one.

Everything that comes in is checked before it counts: a hello that is not a descendant of the
launcher, or out of range, is dropped with one line.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable

import psutil

from ddptui.contract.protocol.codec import parse
from ddptui.contract.safe_text import plain

HELLO_BYTES = 4096  # a hello is one short JSON line
MAX_RANKS = 1 << 16
GONE_GRACE_S = 2.0  # a rank's process gone, its exit code not told by the launcher: unknown then
UNKNOWN = 255  # the exit code of a rank whose end nobody told


class RankDoor:
    """A Unix socket in a folder of its own (0700). Each connection starts with one JSON line: a
    rank's stream ({pid, rank, world, stream, gpu}), then its bytes; or the launcher's, then a
    line per child that ended ({ended, code}); or a rank of the run's saying that it starts
    ranks of its own ({launches: pid, how}), answered "+". `arrived(hello, fd)`, `ended(pid,
    code)` and `launches(pid, how)` are called from the door's threads; `say(text)` for what is
    refused."""

    def __init__(self, arrived: Callable[[dict, int], None], ended: Callable[[int, int], None],
                 launches: Callable[[int, str], None], say: Callable[[str], None]):
        self.arrived, self.ended, self.launches, self.say = arrived, ended, launches, say
        self.folder = tempfile.mkdtemp(prefix="ddptui-ranks-")
        self.path = os.path.join(self.folder, "ranks.sock")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        os.chmod(self.path, 0o600)
        self._server.listen(64)
        self.launcher: int | None = None  # whose descendants may come in
        self._closed = False
        threading.Thread(target=self._accept, name="rank-door", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="rank-door-conn",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            hello = _hello(conn)
            if hello is None or not isinstance(hello, dict):
                raise ValueError("not a hello")
            if "launcher" in hello:
                self._launcher_reports(conn)
                return
            if "launches" in hello:
                pid, how = self._launching(hello)
                conn.sendall(b"+")
                conn.close()
                self.launches(pid, how)
                return
            checked = self.check(hello)
        except (OSError, ValueError) as e:
            self.say(f"a connection to the run's rank socket was dropped: {e}")
            conn.close()
            return
        self.arrived(checked, conn.detach())

    def check(self, hello: dict) -> dict:
        """The hello's fields in range, from a process under the launcher; raises ValueError."""
        pid, rank, world, stream = (hello.get(k) for k in ("pid", "rank", "world", "stream"))
        gpu = hello.get("gpu")
        for name, value, top in (("pid", pid, 1 << 31), ("rank", rank, MAX_RANKS - 1),
                                 ("world", world, MAX_RANKS)):
            if type(value) is not int or not 0 <= value <= top:
                raise ValueError(f"bad {name}: {value!r}")
        if rank >= world or stream not in (1, 2) or \
                not (gpu is None or type(gpu) is int and 0 <= gpu < 1024):
            raise ValueError(f"bad rank {rank} of {world}, stream {stream!r} or gpu {gpu!r}")
        launcher = self.launcher  # read once: a restart sets another
        if not self._descendant(pid, launcher):
            raise ValueError(f"pid {pid} is not a process of this run's launcher")
        return {"pid": pid, "rank": rank, "world": world, "stream": stream, "gpu": gpu,
                "launcher": launcher}

    @staticmethod
    def _launching(hello: dict) -> tuple[int, str]:
        """A rank the run started (a child of its process) that calls a launcher; raises
        ValueError."""
        pid, how = hello.get("launches"), hello.get("how")
        if type(pid) is not int or not isinstance(how, str) or len(how) > 300:
            raise ValueError("bad launches hello")
        try:
            if psutil.Process(pid).ppid() != os.getpid():
                raise ValueError(f"pid {pid} is not a rank of this run")
        except psutil.Error:
            raise ValueError(f"pid {pid} is gone") from None
        return pid, plain(how)

    @staticmethod
    def _descendant(pid: int, launcher: int | None) -> bool:
        if launcher is None:
            return False
        try:
            return any(a.pid == launcher for a in psutil.Process(pid).parents())
        except psutil.Error:
            return False

    def _launcher_reports(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            for raw in f:
                report = parse(raw[:256]) or {}
                pid, code = report.get("ended"), report.get("code")
                if type(pid) is int and type(code) is int and -64 <= code <= 255:
                    self.ended(pid, code)

    def close(self) -> None:
        self._closed = True
        try:
            self._server.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


def _hello(conn: socket.socket) -> dict | None:
    """The connection's first line, read byte by byte so that none of what follows is taken."""
    conn.settimeout(5.0)
    data = b""
    while not data.endswith(b"\n"):
        byte = conn.recv(1)
        if not byte or len(data) >= HELLO_BYTES:
            raise ValueError("no whole hello line")
        data += byte
    conn.settimeout(None)
    return parse(data)


class Adopted:
    """A rank's process that ddptui did not start (its launcher did), as far as subprocess.Popen's
    calls go: alive until it is gone, its exit code as the launcher told it."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.told: int | None = None  # the launcher's word
        self._gone_t: float | None = None
        try:
            self._process: psutil.Process | None = psutil.Process(pid)
        except psutil.Error:
            self._process = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.told is not None:
            self.returncode = self.told
        elif not self._running():
            now = time.monotonic()
            self._gone_t = self._gone_t or now
            if now - self._gone_t >= GONE_GRACE_S:
                self.returncode = UNKNOWN
        return self.returncode

    def _running(self) -> bool:
        try:
            return self._process is not None and self._process.is_running() and \
                self._process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def send_signal(self, sig: int) -> None:
        try:
            if self._running():
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        self.send_signal(9)

    def wait(self, timeout: float | None = None) -> int | None:
        until = time.monotonic() + (GONE_GRACE_S + 1 if timeout is None else timeout)
        while self.poll() is None and time.monotonic() < until:
            time.sleep(0.05)
        return self.returncode

