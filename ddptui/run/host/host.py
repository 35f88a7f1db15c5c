"""A run ddptui owns, served to the dashboards that watch it: each viewer gets the run state as
it is, then every change to it; any viewer's orders steer the run.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time

from ddptui.contract.protocol.orders import (
    Apply,
    AskStacks,
    ChangeSettings,
    KillRank,
    Order,
    Pause,
    ReadOnly,
    RestartGroup,
    RestartRank,
    Resume,
    Stop,
    StopRank,
    TakeCheckpoint,
)
from ddptui.contract.protocol.updates import End, Hello, Update
from ddptui.contract.runs.registry import register, run_name
from ddptui.contract.runs.runtime_dir import RuntimeDir
from ddptui.contract.socket.viewers import (
    MAX_ORDER,
    ORDER_NESTING,
    STACKS_FRESH_S,
    WATCHING,
    Lines,
    TooLong,
    frame,
    listen,
    peer,
)
from ddptui.contract.state.snapshot import dump
from ddptui.run.host.order_check import checked
from ddptui.run.host.refusals import Refusals
from ddptui.run.owned import OwnedRun

TIDY_S = 0.25  # how often dashboards that left or fell behind are tidied away and said
MAX_VIEWERS = 64  # dashboards at once: each costs the run two threads
MAX_BEHIND = 16 << 20  # bytes a dashboard may lag behind before it is dropped (it can attach again)
END_GRACE_S = 5.0  # at the run's end: for each viewer to take the last of it


def serve(run: OwnedRun, metrics: str = "") -> RunHost | None:
    """Record the run for `ddptui ls` (with its `metrics` endpoint) and serve it on its socket,
    from this process; None (said in the run's events) where the runtime folder cannot be used."""
    try:
        host = RunHost(run, RuntimeDir(), f"{os.getpid()}.sock", run_name(run.log_path))
    except OSError as e:
        run.state.say(f"no dashboard can attach to this run: {e}", "warning")
        register(run.log_path, run.state.meta, metrics=metrics)
        return None
    host.record = register(run.log_path, run.state.meta,
                           os.path.join(host.folder.path, host.name_in_folder), metrics)
    host.start()
    return host


class RunHost:
    """Listens on `name` in the runtime folder (a Unix socket, 0600) until close(); `record` is
    the run's record there (register)."""

    def __init__(self, source: OwnedRun, folder: RuntimeDir, name_in_folder: str, name: str):
        self.source, self.folder, self.name = source, folder, name
        self.name_in_folder = name_in_folder
        self.record: str | None = None
        try:
            self.sock = listen(folder.inside(name_in_folder))
        except OSError:
            folder.close()
            raise
        self._viewers: list[_Viewer] = []
        self._behind: list[int] = []  # pids of the viewers dropped for lagging, to be said
        self._refusals = Refusals()
        self._stacks_asked: dict[int, float] = {}  # rank -> when a dashboard last asked
        self._closing = threading.Event()
        source.state.listener = self._publish
        self._threads = [threading.Thread(target=self._accept, name="viewers", daemon=True),
                         threading.Thread(target=self._tidy, name="viewers-tidy", daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def watched(self) -> bool:
        """Whether a dashboard is attached now."""
        return any(not v.gone.is_set() for v in self._viewers)

    def close(self) -> None:
        """The run is over: every viewer gets its end and the last changes, then the socket
        goes."""
        self._closing.set()
        for line in self._refusals.due(time.monotonic(), every=True):
            self.source.note(line)
        with self.source.state.lock:
            self.source.state.listener = None
            viewers, self._viewers = self._viewers, []
        end = frame(End(exit_code=self.source.exit_code))
        for v in viewers:
            v.send(end)
            v.finish()
        deadline = time.monotonic() + END_GRACE_S
        for v in viewers:
            v.sender.join(max(0.0, deadline - time.monotonic()))
            v.drop()
        self.folder.remove(self.name_in_folder)
        self.folder.close()
        self.sock.close()

    # -- viewers come and go ------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            pid, uid = peer(conn)
            if uid != os.getuid():  # the folder's mode keeps others out; this is the second lock
                conn.close()
                self.source.note(f"refused a dashboard of user {uid}")
                continue
            if sum(not v.gone.is_set() for v in self._viewers) >= MAX_VIEWERS:
                conn.close()
                self.source.note(f"refused the dashboard of pid {pid}: {MAX_VIEWERS} dashboards "
                                 "are attached already")
                continue
            viewer = _Viewer(conn, pid, self._order, self._too_long)
            state = self.source.state
            with state.lock:  # no change is lost or sent twice between the snapshot and the stream
                viewer.send(frame(Hello(name=self.name, pid=os.getpid(), log=self.source.log_path,
                                        snapshot=dump(state))))
                self._viewers.append(viewer)
            viewer.start()

    def _publish(self, update: Update) -> None:
        """Each change to the run state (called under its lock): to every viewer, encoded once."""
        if not self._viewers:
            return
        try:
            data = frame(update)
        except (TypeError, ValueError):  # not JSON: the dashboards miss it, the run goes on
            return
        for v in list(self._viewers):
            if not v.send(data):
                self._viewers.remove(v)
                if not v.gone.is_set():
                    self._behind.append(v.pid)  # said by _tidy: this runs under the state's lock
                v.drop()

    def _tidy(self) -> None:
        """Refusals summed up, dashboards dropped for lagging said (not under the state's
        lock), and those that left let go."""
        while not self._closing.wait(TIDY_S):
            for line in self._refusals.due(time.monotonic()):
                self.source.note(line)
            while self._behind:
                self.source.note(f"dropped the dashboard of pid {self._behind.pop(0)}: it fell "
                                 f"{MAX_BEHIND >> 20} MiB behind (it can attach again)")
            with self.source.state.lock:
                self._viewers = [v for v in self._viewers if not v.gone.is_set()]

    # -- orders --------------------------------------------------------------------------------
    def _order(self, viewer: _Viewer, message: dict | None) -> None:
        """A dashboard's message: carried out when the run can take it, else refused: a line
        saying why, as long as that dashboard's refusals are few (refusals.py); nothing an
        order does may end its dashboard's reader, or the run."""
        try:
            order, why = checked(message, self.source)
            if order is not None and why is None and viewer.read_only and \
                    order.NAME not in WATCHING:
                why = f"{order.NAME}: this dashboard may only watch (read-only)"
            elif isinstance(order, ReadOnly) and why is None:
                viewer.read_only = True
                return
            elif order is not None and why is None:
                self._carry_out(order)
                return
        except Exception as e:  # a bug of ours: that order is lost, the run goes on
            why = f"{type(e).__name__}: {e}"
        line, close = self._refusals.refused(viewer.pid, why or "not an order", time.monotonic())
        if line:
            self.source.note(line)
        if close:
            viewer.drop()

    def _too_long(self, viewer: _Viewer, e: TooLong) -> None:
        """A message over the bound: its connection ends, said as a refusal is (a dashboard that
        attaches again and again to send them is summed up too)."""
        line, _close = self._refusals.refused(viewer.pid, str(e), time.monotonic())
        if line:
            self.source.note(f"closed the dashboard of pid {viewer.pid}: {e}")

    def _carry_out(self, order: Order) -> None:
        s = self.source
        match order:
            case ChangeSettings():
                s.change_settings(request=order.request, **order.settings)
            case Stop():
                s.stop(code=130 if order.code is None else order.code)
            case RestartGroup():
                s.restart_group(kill=order.kill)
            case StopRank():
                s.stop_rank(order.rank)
            case RestartRank():
                s.restart_rank(order.rank)
            case KillRank():
                s.kill_rank(order.rank)
            case AskStacks():
                now = time.monotonic()
                if now - self._stacks_asked.get(order.rank, -STACKS_FRESH_S) >= STACKS_FRESH_S:
                    self._stacks_asked[order.rank] = now
                    s.stacks(order.rank)
            case Apply():
                s.apply_now()
            case Pause():
                s.pause()
            case Resume():
                s.resume()
            case TakeCheckpoint():
                s.checkpoint()


class _Viewer:
    """One dashboard's connection (`pid`: its process): a thread sends what is queued for it,
    another reads its orders."""

    def __init__(self, conn: socket.socket, pid: int, on_order, on_too_long):
        self.conn, self.pid, self.on_order, self.on_too_long = conn, pid, on_order, on_too_long
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.behind = 0  # bytes queued, not sent yet
        self.read_only = False  # it said so: every order of its after that but stacks is refused
        self._lock = threading.Lock()
        self.gone = threading.Event()
        self.sender = threading.Thread(target=self._send_loop, name="viewer-out", daemon=True)
        self.reader = threading.Thread(target=self._read_loop, name="viewer-in", daemon=True)

    def start(self) -> None:
        self.sender.start()
        self.reader.start()

    def send(self, data: bytes) -> bool:
        """Queue `data`; False when this viewer is gone or too far behind."""
        with self._lock:
            if self.gone.is_set() or self.behind + len(data) > MAX_BEHIND:
                return False
            self.behind += len(data)
        self.queue.put(data)
        return True

    def finish(self) -> None:
        self.queue.put(None)  # the sender closes after what is queued

    def drop(self) -> None:
        self.gone.set()
        self.queue.put(None)
        with contextlib.suppress(OSError):  # gone already
            self.conn.shutdown(socket.SHUT_RDWR)

    def _send_loop(self) -> None:
        try:
            while True:
                batch = [self.queue.get()]
                while not self.queue.empty() and len(batch) < 4096:
                    batch.append(self.queue.get())
                data = b"".join(b for b in batch if b is not None)
                if data:
                    self.conn.sendall(data)
                    with self._lock:
                        self.behind -= len(data)
                if None in batch:
                    return
        except OSError:
            pass  # the viewer went: its reader sees it too
        finally:
            self.gone.set()
            with contextlib.suppress(OSError):  # gone already
                self.conn.shutdown(socket.SHUT_WR)

    def _read_loop(self) -> None:
        try:
            for order in Lines(self.conn, MAX_ORDER, ORDER_NESTING):
                if self.gone.is_set():  # dropped: what it sent after that is not read
                    break
                self.on_order(self, order)
        except TooLong as e:
            self.on_too_long(self, e)
        except OSError:
            pass  # gone
        self.drop()
        self.conn.close()
