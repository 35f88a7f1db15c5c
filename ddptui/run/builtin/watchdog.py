"""The supervisor's watch over the members of the world: folds their step, heartbeat and GPU
events, asks health.py for verdicts twice a second and reports every change as a `rank` event,
and inputwatch.py whether the input holds them back; fetches a stalled rank's Python stacks and,
with --on-stall recover, has it killed. It decides, and returns what to do as actions (actions.py):
the supervisor's thread carries them out.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ddptui.contract.observe.stacks import StackRequests, stacks_said
from ddptui.contract.protocol.events import Beat, Gpu, Step
from ddptui.contract.protocol.steptime import Phases
from ddptui.contract.stalls.health import Seen, Stragglers, gpu_cause, judge_stalls
from ddptui.contract.state.verdicts import stragglers
from ddptui.contract.states import RankState
from ddptui.run.actions import Action, Flag, Kill, Record
from ddptui.run.inputwatch import InputWatch, Pipeline

CHECK_EVERY_S = 0.5
SLOW_HOLD = 6  # checks (3 s) a straggler verdict must hold before it is shown, or dropped


@dataclass
class Member:
    """A member of the world as the supervisor hands it over: its current process and GPU."""

    slot: int
    pid: int | None
    gpu: int | None
    stacks_path: str


class Watchdog:
    """check() once per supervisor loop, which returns the actions; observe() every step, beat
    and gpu event."""

    def __init__(self, stall_after: float | None, recover: bool, enabled: bool,
                 process: Callable[[int | None], tuple],
                 pipeline: Callable[[], Pipeline | None] = lambda: None):
        """What it asks, never what it does: `process(pid)`: the process's status and CPU %;
        `pipeline()`: the input settings in force, for the input watch (None: it keeps quiet)."""
        self.stall_after, self.recover, self.enabled = stall_after, recover, enabled
        self.process, self.pipeline = process, pipeline
        self.last_step: dict[int, float] = {}
        self.step_ms: dict[int, deque] = {}
        self.beats: dict[int, Beat] = {}
        self.gpus: dict[int, Gpu] = {}  # slot -> its GPU's latest reading
        self.phases: dict[int, Phases] = {}  # slot -> its latest window of phases
        self.since: dict[int, float] = {}  # slot -> when it (re)entered the world or resumed
        self.flags: dict[int, str] = {}  # slot -> stalled | waiting | slow
        self.stepped: set[int] = set()  # slots whose current process has finished a step
        self.stragglers = Stragglers()
        self.inputs = InputWatch()
        self.stacks = StackRequests()
        self._kill_pending: dict[int, str] = {}  # on-stall recover: once its stacks are in
        self._streak: dict[int, tuple[bool, int]] = {}  # slot -> (slow?, checks in a row)
        self._next = 0.0

    def observe(self, ev: Step | Beat | Gpu | Phases) -> None:
        slot = ev.rank
        match ev:
            case Step():
                self.last_step[slot] = ev.t
                self.stepped.add(slot)
                self.step_ms.setdefault(slot, deque(maxlen=50)).append(ev.step_ms or 0.0)
                self.stragglers.add(slot, ev.steps or 1, ev.step_ms or 0.0, ev.data_wait or 0.0)
                self.inputs.observe(ev)
            case Beat():
                self.beats[slot] = ev
            case Gpu():
                self.gpus[slot] = ev
            case Phases():
                self.phases[slot] = ev

    def restart_clock(self, slots, now: float, first_step: bool = False) -> None:
        """The world changed, the run resumed, or (`first_step`) the input pipeline was rebuilt
        and its workers start again: silence until now says nothing."""
        self.inputs.fresh(slots)
        for slot in slots:
            self.since[slot] = now
            self.stragglers.forget(slot)
            self.phases.pop(slot, None)
            if first_step:
                self.stepped.discard(slot)

    def forget(self, slot: int) -> None:
        """The slot left the world (stopped, crashed): no verdicts about it any more."""
        self.stepped.discard(slot)
        for table in (self.last_step, self.step_ms, self.beats, self.since, self.flags,
                      self._kill_pending, self._streak, self.phases):
            table.pop(slot, None)
        self.stragglers.forget(slot)

    def stalled(self) -> list[int]:
        return [s for s, state in self.flags.items() if state == RankState.STALLED]

    def ask_stacks(self, m: Member, now: float) -> None:
        self.stacks.ask(m.slot, m.pid, m.stacks_path, now)

    def check(self, now: float, members: list[Member], held: bool) -> list[Action]:
        """`held`: the run is paused or its world changes: no verdicts, stacks still come in."""
        out: list[Action] = []
        for slot, text in self.stacks.collect(now):
            out += self._stacks_in(slot, text)
        if now < self._next:
            return out
        self._next = now + CHECK_EVERY_S
        if not self.enabled or held:
            return out
        seen = [self._seen(m, now) for m in members]
        verdicts = {s: (v.state, v.reason, v.fields)
                    for s, v in judge_stalls(seen, now, self.stall_after).items()}
        if not verdicts:  # only a world that makes progress has stragglers
            live = [m.slot for m in members]
            verdicts = self._by_phases(live)
            if verdicts is None:  # a rank without its phases yet (or the clock off)
                verdicts = {s: ("slow", cause, {"cause": cause.split(":")[0]})
                            for s, cause in self.stragglers.judge(live, self.gpus).items()}
        for m in members:
            out += self._update(m, verdicts.get(m.slot), now)
        pipeline = None if verdicts else self.pipeline()
        said = pipeline and self.inputs.check([m.slot for m in members], pipeline)
        if said:
            out.append(Record(said))
        return out

    def _by_phases(self, live: list[int]) -> dict[int, tuple] | None:
        """Stragglers by their own time (the step less the all-reduce wait) in their latest
        windows, as the `e` screen and the verdict judge them, with the phase that makes the
        difference; None until every live rank has a window."""
        figs = {s: (p.step_ms, {k: v[0] for k, v in p.phases.items()
                                if isinstance(v, (list, tuple)) and v and isinstance(v[0], (int, float))})
                for s in live if (p := self.phases.get(s)) is not None
                and isinstance(p.step_ms, (int, float))}  # (a NaN is read as null)
        if len(figs) < len(live):
            return None
        out = {}
        for found in stragglers(figs, {}, {}):
            phase = found.fields["phase"]
            gpu = gpu_cause(self.gpus.get(found.rank)) if phase in (
                "forward", "backward", "optimizer") else ""
            cause = "data-wait" if phase == "data" else (gpu.split(":")[0] or "compute")
            reason = found.text.split(": ", 1)[1] + (f": {gpu}" if gpu else "")
            out[found.rank] = ("slow", reason, {"cause": cause, "phase": phase})
        return out

    def _seen(self, m: Member, now: float) -> Seen:
        since = max(self.last_step.get(m.slot, 0.0), self.since.get(m.slot, now))
        recent = self.step_ms.get(m.slot)
        beat = self.beats.get(m.slot)
        status, cpu = self.process(m.pid)
        gpu = self.gpus.get(m.slot)
        return Seen(m.slot, since, statistics.median(recent) / 1000 if recent else None,
                    beat and beat.t, beat and beat.global_step, beat.phase if beat else "",
                    status, cpu, gpu.util if gpu is not None and m.gpu is not None else None,
                    m.slot in self.stepped)

    def _update(self, m: Member, verdict: tuple | None, now: float) -> list[Action]:
        old = self.flags.get(m.slot)
        if not self._held(m.slot, verdict, old):
            return []
        if verdict is None:
            if old is None:
                return []
            del self.flags[m.slot]
            return [Flag(m.slot, "running", "making progress again" if old != "slow" else "")]
        state, reason, fields = verdict
        if state == old:
            return []
        self.flags[m.slot] = state
        if state == RankState.STALLED:
            self.ask_stacks(m, now)
            if self.recover:
                self._kill_pending[m.slot] = reason
        return [Flag(m.slot, state, reason, fields)]

    def _held(self, slot: int, verdict: tuple | None, old: str | None) -> bool:
        """A straggler verdict (or its end) counts once it has held SLOW_HOLD checks in a row:
        step figures of small steps on a shared host swing 15% from one reading to the next."""
        slow_now = verdict is not None and verdict[0] == "slow"
        if not (slow_now or old == "slow") or (verdict is not None and not slow_now):
            self._streak.pop(slot, None)
            return True
        count = self._streak.get(slot, (slow_now, 0))
        count = (slow_now, count[1] + 1 if count[0] == slow_now else 1)
        self._streak[slot] = count
        return count[1] >= SLOW_HOLD

    def _stacks_in(self, slot: int, text: str | None) -> list[Action]:
        out: list[Action] = [Record(stacks_said(slot, text,
                                                self.flags.get(slot) == RankState.STALLED))]
        if slot in self._kill_pending:
            out.append(Kill(slot, f"--on-stall recover: {self._kill_pending.pop(slot)}"))
        return out
