"""What is worth a message, read from the run's state once a second: a rank stalled (with where
its stacks say it is), crashed (its exception), slow for a minute, back, and the run's end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ddptui.contract.console import summary
from ddptui.contract.monitor.notify import Message
from ddptui.contract.observe.stacks import innermost
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.views import RankView, RunView
from ddptui.contract.states import RankState
from ddptui.contract.wording import ranks_named

EVERY_S = 1.0
STACKS_WAIT_S = 5.0  # a stalled rank's message waits this long for its stacks
STRAGGLER_S = 60.0  # slow this long, without a break: a straggler
ENDS = ("done", "failed", "interrupted")
MANY = 3  # more ranks than this of one kind at once: one message


@dataclass
class Look:
    """What one look at the run reads."""

    ranks: list[RankView]
    status: str


class RunWatch:
    """start() reads `state` every EVERY_S on a thread until stop(), which reads it once more
    (the run's end) and hands every message to `say`."""

    def __init__(self, state: RunState, say: Callable[[Message], None], run: str, log: str):
        self.state, self.say, self.run, self.log = state, say, run, log
        self._states: dict[int, RankState] = {}
        self._seen: dict[int, int] = {}  # rank -> the changes of it read
        # rank -> (its verdict's time, what it said, when it was read): said with its stacks
        self._stalled: dict[int, tuple[float, str, float]] = {}
        self._slow: dict[int, float] = {}  # rank -> since when it is slow, or -1 once said
        self._ended = False
        self._batch: list[Message] = []  # what one look found
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(5.0)
        self.check(self._look(), time.monotonic(), final=True)

    def _run(self) -> None:
        while not self._halt.wait(EVERY_S):
            self.check(self._look(), time.monotonic())

    def _look(self) -> Look:
        """The ranks and the run's status: all a look needs (a whole view copies every GPU's
        five minutes of readings, under the lock attach's listeners wait on)."""
        with self.state.lock:
            return Look([r.copied() for r in self.state.ranks.values()], self.state.status)

    def check(self, view: RunView | Look, now: float, final: bool = False) -> None:
        for r in view.ranks:
            # Every change since the last look, in the order they came (counted, not timed: a
            # rank's own stamps and attach's verdicts are on different clocks).
            new = min(r.changed - self._seen.get(r.rank, 0), len(r.changes))
            for t, state, reason in list(r.changes)[len(r.changes) - new:]:
                self._changed(r, state, reason, t, now)
            self._seen[r.rank] = r.changed
            self._straggler(r, now)
            stall = self._stalled.get(r.rank)
            if stall and (r.stacks_t >= stall[0] or now - stall[2] >= STACKS_WAIT_S or final):
                self._say_stalled(r)
        self._flush()
        if view.status in ENDS and not self._ended:
            self._ended = True
            whole = self.state.view()  # once: the exit line's figures
            text = summary(whole) + (f" ({whole.reason})" if whole.reason else "")
            self.say(Message(whole.status, f"run {self.run}: {text}", self.run,
                             cause=whole.reason, log=self.log))

    def _changed(self, r: RankView, state: RankState, reason: str, t: float,
                 now: float) -> None:
        before, self._states[r.rank] = self._states.get(r.rank), state
        if r.rank in self._stalled and state != RankState.STALLED:
            self._say_stalled(r)  # what came of it is said after it
        if state == RankState.STALLED:  # not its peers waiting for it: one message, not 511
            self._stalled.setdefault(r.rank, (t, f"{state}: {reason}" if reason else state, now))
        elif state == RankState.CRASHED:
            last = r.error[-1] if r.error else ""
            self._message("crashed", r, f"crashed: {reason or last or 'no reason given'}", reason)
        elif state == RankState.RESTARTING and before in (RankState.CRASHED, RankState.STOPPED,
                                                          RankState.STALLED):
            self._message("restarted", r, "restarting", reason)

    def _say_stalled(self, r: RankView) -> None:
        t, what, _ = self._stalled.pop(r.rank)
        top = innermost(r.stacks, frames=2) if r.stacks and r.stacks_t >= t else ""
        self._message("stalled", r, what + (f"; at {top}" if top else ""), what)

    def _straggler(self, r: RankView, now: float) -> None:
        if r.state != RankState.SLOW:
            self._slow.pop(r.rank, None)
            return
        since = self._slow.setdefault(r.rank, now)
        if since >= 0 and now - since >= STRAGGLER_S:
            self._slow[r.rank] = -1.0
            self._message("straggler", r, f"slow for {STRAGGLER_S:.0f} s" +
                          (f": {r.reason}" if r.reason else ""), r.reason)

    def _message(self, event: str, r: RankView, what: str, cause: str) -> None:
        where = f" on {r.node or r.host}" if r.node or r.host else ""
        self._batch.append(Message(event, f"run {self.run}: rank {r.rank}{where} {what}",
                                   self.run, rank=r.rank, node=r.node or r.host, cause=cause,
                                   log=self.log))

    def _flush(self) -> None:
        """A look's messages: each alone, but many ranks of one kind at once (a job's hang,
        a node lost) as one message that names them and tells the first."""
        kinds: dict[str, list[Message]] = {}
        for m in self._batch:
            kinds.setdefault(m.event, []).append(m)
        self._batch = []
        for event, messages in kinds.items():
            if len(messages) <= MANY:
                for m in messages:
                    self.say(m)
                continue
            ranks = sorted(m.rank for m in messages if m.rank is not None)
            first = messages[0]
            named = ranks_named(ranks) if len(ranks) <= 10 or ranks[-1] - ranks[0] == len(
                ranks) - 1 else f"{len(ranks)} ranks ({', '.join(map(str, ranks[:10]))}, ...)"
            self.say(Message(event, f"run {self.run}: {named} {event};"
                             f" the first: {first.text.removeprefix(f'run {self.run}: ')}",
                             self.run, cause=first.cause, log=self.log))
