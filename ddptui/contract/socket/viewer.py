"""A run ddptui owns, seen from another process: the dashboard of `ddptui run` and of `ddptui
attach RUN`. Its state comes whole on connecting, then change by change; keys go as orders.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading

import psutil

from ddptui.contract.observe.endings import last_run_event
from ddptui.contract.protocol.codec import event_of, update_of
from ddptui.contract.protocol.events import PARENT, Event, Run
from ddptui.contract.protocol.orders import (
    Apply,
    AskStacks,
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
    settings_request,
)
from ddptui.contract.protocol.updates import Applied, End, Hello, HostReadings, Said
from ddptui.contract.socket.viewers import MAX_UPDATE, WATCHING, Lines, connect, frame
from ddptui.contract.state.snapshot import load
from ddptui.contract.state.source import RunSource

GONE_POLL_S = 1.0  # how often the run's process is looked for
GONE_GRACE_S = 2.0  # once it is gone: for its last messages to arrive


class RunGone(OSError):
    """The run's process closed the socket before it said hello (it ended meanwhile)."""


class Viewer(RunSource):
    """Connects at once (the first screen shows the whole run so far); start() follows it.
    `owns_ranks`: q ends the run (after asking), `d` leaves it going."""

    can_detach = True

    def __init__(self, path: str, read_only: bool = False):
        self.read_only = read_only  # it may only watch: no order but stacks (the run refuses any other)
        self.sock = connect(path)
        self._messages = iter(Lines(self.sock, MAX_UPDATE))  # hello first, then the changes
        hello = self._hello()
        self.name, self.pid, self.log_path = hello.name, hello.pid, hello.log
        self.state = load(hello.snapshot)
        self.done = threading.Event()
        self.exit_code: int | None = None
        self.lost = False  # the connection ended without the run's end
        self._orders: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe in a signal handler
        if read_only:  # the first thing the run hears of it
            self._orders.put(ReadOnly())
        self._process = _process(self.pid)
        self._threads = [threading.Thread(target=self._follow, name="viewer", daemon=True),
                         threading.Thread(target=self._send, name="orders", daemon=True),
                         threading.Thread(target=self._watch_process, name="run-process",
                                          daemon=True)]

    def _hello(self) -> Hello:
        first = update_of(next(self._messages, None))
        if isinstance(first, Hello):
            return first
        self.sock.close()
        raise RunGone("the run ended before it could be shown")


    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Leave the run (it goes on)."""
        self._orders.put(None)
        with contextlib.suppress(OSError):  # gone already
            self.sock.shutdown(socket.SHUT_RDWR)

    def _follow(self) -> None:
        try:
            for m in self._messages:
                self._take(update_of(m))
        except OSError:
            pass
        finally:
            if not self.done.is_set():
                self.lost = True
                self.state.say("lost the run's process: it ended without a word, or dropped "
                               "this dashboard (ddptui ls says which)", "error")
                self.done.set()

    def _watch_process(self) -> None:
        """The run's process gone, and its socket still open (a process that outlived it holds
        its end: no end and no EOF would ever come): the run's end is read from its log."""
        while not self.done.wait(GONE_POLL_S):
            if self._process is None or _alive(self._process):
                continue
            if self.done.wait(GONE_GRACE_S):  # its own `end` was on its way
                return
            end = last_run_event(self.log_path)
            if end is None:
                return  # its log says nothing of an end: lost, as on EOF
            self.exit_code = end.exit_code
            self.state.say("the run's process ended; its log says how", "warning")
            self.done.set()
            with contextlib.suppress(OSError):  # the reader sees the end of it
                self.sock.shutdown(socket.SHUT_RDWR)
            return

    def _take(self, m) -> None:
        match m:
            case Applied(ev=ev) if (applied := event_of(ev)) is not None:
                self.state.apply(applied)
            case Said(text=text, level=level, t=t):
                self.state.say(text, level, t)
            case HostReadings(host=host):
                self.state.set_host(host)
            case End(exit_code=code):
                self.exit_code = code
                self.done.set()

    def _send(self) -> None:
        while (order := self._orders.get()) is not None:
            try:
                self.sock.sendall(frame(order))
            except OSError:
                return

    def _order(self, order: Order, note: Event | None = None) -> None:
        if self.read_only and order.NAME not in WATCHING:
            return  # the run would refuse it (the screen says why the key cannot act)
        if note is not None:  # on screen at once, as in the run's
            self.state.apply(note)
        self._orders.put(order)

    # -- the RunSource calls: each an order to the run's process ------------------------------
    def stop(self, status: str = "interrupted", code: int = 130) -> None:
        if not self.done.is_set():
            self._order(Stop(code=code))

    def pause(self) -> None:
        self._order(Pause(), Run(rank=PARENT, status="pausing"))

    def resume(self) -> None:
        self._order(Resume(), Run(rank=PARENT, status="resuming"))

    def checkpoint(self) -> None:
        self._order(TakeCheckpoint())

    def change_settings(self, request: str | None = None, **settings) -> None:
        requested, cmd = settings_request(settings, request)
        self._order(cmd, requested)

    def apply_now(self) -> None:
        self._order(Apply())

    def stop_rank(self, rank: int) -> None:
        self._order(StopRank(rank=rank))

    def restart_rank(self, rank: int) -> None:
        self._order(RestartRank(rank=rank))

    def kill_rank(self, rank: int) -> None:
        self._order(KillRank(rank=rank))

    def restart_group(self, kill: int | None = None) -> None:
        self._order(RestartGroup(kill=kill))

    def stacks(self, rank: int) -> None:
        self._order(AskStacks(rank=rank))


def _process(pid: int) -> psutil.Process | None:
    """The run's process, as it is now (its start time tells it from a later one of its pid)."""
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _alive(p: psutil.Process) -> bool:
    """Running, and not a zombie: `ddptui run` is the parent of its run's process, whose end it
    only reaps when it exits itself (psutil's is_running() is true of a zombie)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
