"""What a run that ddptui owns has in common, whether it runs the built-in trainer (Supervisor)
or your script (ScriptRun): one thread drives it, its log is written as it goes, the steering
calls return at once (key and signal handlers make them), and the dashboard and signal handlers
wait on `done` and read `exit_code`.
"""

from __future__ import annotations

import queue
import threading
import traceback
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ddptui.contract.jsonl import JsonlWriter
from ddptui.contract.protocol.events import PARENT, Event, Notice, Rank, Run
from ddptui.contract.protocol.orders import (
    Apply,
    AskStacks,
    KillRank,
    Order,
    Pause,
    RestartRank,
    Resume,
    Stop,
    StopRank,
    TakeCheckpoint,
    settings_request,
)
from ddptui.contract.state.report import verdict_event
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.source import RunSource
from ddptui.run.actions import Action, Fail, Flag, Joining, Kill, Record, Say, Standby, Tell
from ddptui.run.outcome import EXIT_FAILED, EXIT_INTERRUPTED, Ending, Outcome
from ddptui.run.readings import RunSampler


@dataclass(frozen=True)
class _Note:
    """A line another thread asks the run's thread to log (queued beside the orders)."""

    text: str
    level: str


class OwnedRun(RunSource):
    """Made with what every owned run has: its log, its state, the loop its thread runs
    (`main`) and the orders that thread carries out itself (`own`, by order class; the rest go
    to the ranks through `_send`). Subclasses give `_handle` (every event: state, then log)
    and the abstract methods below; `sampler` is theirs once NVML and psutil are open."""

    def __init__(self, log_path: str, state: RunState, main: Callable[[], None], name: str,
                 own: dict[type[Order], Callable[[Any], None]]):
        self.log_path, self.state = log_path, state
        self._thread = threading.Thread(target=main, name=name, daemon=True)
        self._own = own
        self.outcome = Outcome()  # a script's: its current attempt's
        self.done = threading.Event()
        self.exit_code: int | None = None
        self.sampler: RunSampler | None = None
        self._writer: JsonlWriter | None = None
        # SimpleQueue: stop() runs in signal handlers, and Queue.put's lock is not reentrant.
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # Whether a dashboard shows the run now; the run's own process has its host say.
        self.watched: Callable[[], bool] = lambda: False
        self.log_lost: str | None = None  # why the log could not be written, once it could not

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        self._writer = JsonlWriter(self.log_path)
        self._thread.start()

    # -- what every rank carries out at an agreed step --------------------------------------
    def pause(self) -> None:
        self._order(Pause(), Run(rank=PARENT, status="pausing"))

    def resume(self) -> None:
        self._order(Resume(), Run(rank=PARENT, status="resuming"))

    def checkpoint(self) -> None:
        self._order(TakeCheckpoint())

    def change_settings(self, request: str | None = None, **settings) -> None:
        """Ask for new input-pipeline settings; every rank applies them at the next epoch.
        `request`: the id a dashboard gave the request (its screen shows it pending at once)."""
        requested, cmd = settings_request(settings, request)
        self._order(cmd, requested)

    def apply_now(self) -> None:
        """Pending settings take effect at the next agreed step instead of the next epoch."""
        self._order(Apply())

    def _order(self, cmd: Order, note: Event | None = None) -> None:
        """Send `cmd` on to the ranks; `note` (what was asked) goes on screen once it is sent."""
        if note is not None:
            self.state.apply(note)
        self._commands.put(cmd)

    # -- the run's own: queued for its thread -------------------------------------------------
    def stop(self, status: str = "interrupted", code: int = EXIT_INTERRUPTED,
             reason: str = "") -> None:
        """Orderly end, as the run knows how (ranks agree on a step, or get the signal torchrun
        would send); a second call ends every process at once."""
        self._commands.put(Stop(status=status, code=code, reason=reason))

    # -- rank by rank (a script's: under run.elastic, or `t`) ---------------------------------
    def stop_rank(self, rank: int) -> None:
        """The rank leaves at an agreed step; the others go on re-sharded as one fewer."""
        self._commands.put(StopRank(rank=rank))

    def restart_rank(self, rank: int) -> None:
        """A stopped or crashed rank joins again (as soon as its standby is warm); a running one
        leaves and joins again."""
        self._commands.put(RestartRank(rank=rank))

    def kill_rank(self, rank: int) -> None:
        """SIGKILL the rank (a stalled one above all): crash recovery follows."""
        self._commands.put(KillRank(rank=rank))

    def stacks(self, rank: int) -> None:
        """Ask the rank for every thread's Python stack."""
        self._commands.put(AskStacks(rank=rank))

    def say(self, text: str, level: str = "info") -> None:
        """A message of ddptui's own, in the log and the event pane (the run's thread only)."""
        self.record(Notice(rank=PARENT, level=level, text=text))

    def record(self, ev: Event) -> None:
        """An event of ddptui's own that says more than a line (the run's thread only)."""
        self._handle(ev)

    def _log(self, ev: Event) -> None:
        """Into the log, whole lines only. A log that cannot be written (a full disk) ends the
        run in order, said once on screen: its last `run` event still goes in where it fits,
        and `log_lost` says why for the run's record (ls)."""
        if self._writer is None:
            return
        last = isinstance(ev, Run) and ev.exit_code is not None
        if last and not ev.restarting and self.state.steptimes.verdict is None:
            self._verdict()
        if self._writer.write(ev, last=last) or self.log_lost:
            return
        self.log_lost = f"its log {self.log_path} cannot be written: {self._writer.failed}"
        self.state.say(f"the run ends: {self.log_lost}", "error")
        self.stop("failed", EXIT_FAILED, self.log_lost)

    def _verdict(self) -> None:
        """The verdict, just before the run's end; one that cannot be made costs the run its
        verdict only (its traceback on stderr), never its end."""
        try:
            ev = verdict_event(self.state)
        except Exception as e:
            traceback.print_exc()
            self._handle(Notice(rank=PARENT, level="warning",
                                text=f"no verdict for this run: {type(e).__name__}: {e}"))
            return
        self._handle(ev)

    def note(self, text: str, level: str = "warning") -> None:
        """say() from another thread (the dashboards' host): the run's thread logs it; once the
        run is over, only the screens get it."""
        if self.done.is_set():
            self.state.say(text, level)
        else:
            self._commands.put(_Note(text, level))

    # -- the membership's decisions (ddptui/run/membership.py), carried out by the thread --------
    def _act(self, actions: list[Action]) -> None:
        for a in actions:
            match a:
                case Tell(slot, order):
                    self._tell(slot, order)
                case Say(text, level):
                    self.say(text, level)
                case Record(ev):
                    self.record(ev)
                case Kill(slot, why):
                    self._kill(slot, why)
                case Standby(slot):
                    self._standby(slot)
                case Joining(slot):
                    self._joining(slot)
                case Fail(reason, code):
                    self._fail(code, reason)
                case Flag(slot, state, reason, fields):
                    self._flag(slot, state, reason, fields)

    def _flag(self, slot: int, state: str, reason: str, fields: dict) -> None:
        """A health verdict on a slot, as its `rank` event."""
        self._handle(Rank(rank=slot, state=state, reason=reason, **fields))

    # -- the commands queued for the thread: the run's own, and a stop's one sequence ----------
    def _run_commands(self) -> None:
        for cmd in self._queued():
            if isinstance(cmd, _Note):
                self.say(cmd.text, cmd.level)
            else:
                self._own.get(type(cmd), self._send)(cmd)

    def _stop(self, cmd: Stop) -> None:
        """q, Ctrl-C, SIGTERM: the first says how the run ends and winds it down; the second
        ends every process at once."""
        code = EXIT_INTERRUPTED if cmd.code is None else cmd.code
        if self.outcome.asked_to_stop(Ending(cmd.status or "interrupted", code, cmd.reason or "")):
            self._wind_down(code)
        else:
            self._end_now()

    @abstractmethod
    def _send(self, cmd: Order) -> None:
        """A command for the ranks, on to them."""

    @abstractmethod
    def _wind_down(self, code: int) -> None:
        """End the run as it knows how: the ranks agree on a last step, or get the signal
        torchrun would send; those that cannot end by themselves are ended sooner."""

    @abstractmethod
    def _end_now(self) -> None:
        """End every process now."""

    @abstractmethod
    def _tell(self, slot: int, order: Order) -> None:
        """Send the order to the slot's process."""

    @abstractmethod
    def _kill(self, slot: int, why: str) -> None:
        """SIGKILL the slot's process; its death is handled as any other."""

    @abstractmethod
    def _standby(self, slot: int) -> None:
        """Start a warm process for the slot, which is out of the world."""

    @abstractmethod
    def _joining(self, slot: int) -> None:
        """The slot's standby was told to join."""

    @abstractmethod
    def _fail(self, code: int, reason: str) -> None:
        """The run is lost: every process ends."""

    def _queued(self) -> Iterator[Order | _Note]:
        """The commands the steering calls queued, oldest first (the run's thread only)."""
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _closed(self) -> None:
        """The last of the thread's way out: NVML and the log closed, then `done`."""
        if self.sampler is not None:
            self.sampler.close()
        if self._writer:
            self._writer.close()
        self.done.set()
