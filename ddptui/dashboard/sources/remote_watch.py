"""Stall verdicts in `ddptui attach` for ranks under `python -m ddptui.rank.wrap`, from what they
report: their process figures and output say whether one is stuck (the rules of ddptui run's
script ranks, ddptui/contract/stalls/scripts.py); one that stops reporting at all is unreachable. Their
stacks and NCCL flight recorders say which rank, on whichever node, the others wait for.
"""

from __future__ import annotations

from collections.abc import Callable

from ddptui.contract.observe.flight import behind
from ddptui.contract.observe.output import library_log
from ddptui.contract.protocol.events import (
    PARENT,
    Event,
    Gpu,
    Lines,
    Notice,
    Output,
    Process,
    Rank,
    Stacks,
    Step,
)
from ddptui.contract.safe_text import plain
from ddptui.contract.stalls.scripts import Reading, ScriptStalls, Silence, blame
from ddptui.contract.states import RankState
from ddptui.contract.wording import ranks_named
from ddptui.dashboard.sources.sent_time import SentTime

UNREACHABLE_S = 5.0  # a wrapped rank reports its process every second
STUCK_AFTER_S = 2.0


class RemoteWatch:
    """observe() every event attach receives; check() twice a second (attach's thread)."""

    def __init__(self, stall_after: float, record: Callable[[Event], None],
                 ask_stacks: Callable[[int], bool]):
        self.stalls = ScriptStalls(stall_after)
        self.record, self.ask_stacks = record, ask_stacks
        self.heard: dict[int, float] = {}  # rank -> when any event of it last came
        self.silence: dict[int, Silence] = {}  # rank -> its output (and steps)
        self.process: dict[int, Process] = {}  # rank -> its last process event
        self.gpu_util: dict[int, float] = {}
        self.flags: dict[int, tuple[str, float]] = {}  # rank -> (state, since)
        self.stacks: dict[int, str] = {}  # a stalled rank's stacks since its verdict
        self.traces: dict[int, dict] = {}  # its flight recorder's, compact (observe/flight.py)
        self.places: dict[int, str] = {}  # rank -> "node vm2, local 1"
        # rank -> (why it failed, None where it finished; when its end came)
        self.ended: dict[int, tuple[str | None, float]] = {}
        # a waiting rank -> (where: "in all_reduce #12 (NCCL)", the ranks it waits for)
        self.waiting: dict[int, tuple[str, list[int]]] = {}
        self._said_stuck: tuple = ()
        self.clock = SentTime()
        self.cut: dict[int, str] = {}  # rank -> its node, whose relay was lost with its link

    def observe(self, ev: Event, received: float) -> None:
        """An event, as it is read: judged by when its rank sent it (SentTime)."""
        rank = ev.rank
        if rank == PARENT:
            return
        now = self.clock.sent(rank, ev.t, received)
        # Only a wrapped rank sends its process figures (an attach started mid-run learns it so)
        if isinstance(ev, Rank) and ev.api == "ddptui.rank.wrap" or \
                isinstance(ev, Process) and rank not in self.silence:
            self.silence[rank] = Silence(now)
            self.ended.pop(rank, None)
        if rank not in self.silence:
            return  # not a wrapped rank: its own loop reports its steps
        self.heard[rank] = max(now, self.heard.get(rank, now))  # a backlog comes late
        self.cut.pop(rank, None)  # connected again
        match ev:
            case Rank():
                self._rank(ev, now)
            case Step() | Output() | Lines() if isinstance(ev, Step) or _the_scripts_own(ev):
                self.silence[rank].heard(now)
                if rank in self.flags and self.flags[rank][0] != RankState.UNREACHABLE:
                    self._clear(rank, "making progress again")
            case Process():
                self._alive(rank, self.process.get(rank), ev, now)
                self.process[rank] = ev
            case Gpu() if ev.util is not None:
                self.gpu_util[rank] = ev.util
            case Stacks() if ev.stacks_of == rank and rank in self.flags:
                if ev.flight:
                    self.traces[rank] = ev.flight
                else:
                    self.stacks[rank] = ev.stacks
                self._blame()

    def _rank(self, ev: Rank, now: float) -> None:
        node = ev.node or ev.host  # the host, and the launcher's node rank
        if node:
            local = "?" if ev.local_rank is None else ev.local_rank
            self.places[ev.rank] = f"node {node}, local {local}"
        if ev.state in ("done", "crashed"):
            why = (ev.reason or "failed") if ev.state == "crashed" else None
            self.ended[ev.rank] = (why, now)

    def _alive(self, rank: int, before: Process | None, ev: Process, now: float) -> None:
        """Its vitals moved on: an optimizer step is as good as a line of output; its main
        thread moving on keeps a rank that said something going (ddptui/run/script/watch.py)."""
        steps, moves = ev.opt_steps, ev.moves
        stepped = steps is not None and steps > ((before and before.opt_steps) or 0)
        moved = moves is not None and moves > ((before and before.moves) or 0)
        if stepped or moved and self.silence[rank].last is not None:
            self.silence[rank].heard(now)
            # (no reading before this one, as after attach restarted: nothing to compare with)
            if before is not None and rank in self.flags \
                    and self.flags[rank][0] != RankState.UNREACHABLE:
                self._clear(rank, "making progress again")

    def resume(self, wrapped: list[int], places: dict[int, str], views: dict, now: float) -> None:
        """An attach restarted on its log: the wrapped ranks of the job as it was kept are
        waited for from `now`, and their flags stand until each reports again."""
        self.places.update(places)
        for rank in wrapped:
            view = views.get(rank)
            if view is None:
                continue
            self.silence[rank] = Silence(now)
            if view.state.is_final:
                crashed = view.state == RankState.CRASHED
                self.ended[rank] = ((view.reason or "failed") if crashed else None, now)
                continue
            unreachable = view.state == RankState.UNREACHABLE
            self.heard[rank] = now - UNREACHABLE_S - 1 if unreachable else now
            if view.state in (RankState.STALLED, RankState.WAITING, RankState.UNREACHABLE):
                self.flags[rank] = (view.state, now)

    def lost(self, node: str, ranks: set[int]) -> None:
        """Node `node`'s relay went away with these ranks' link: unreachable until they report
        again (each connects directly a moment later, if it still runs)."""
        for rank in ranks & set(self.silence) - set(self.ended):
            self.cut[rank] = node

    def check(self, now: float) -> None:
        now = self.clock.judged(now)
        for rank, silence in self.silence.items():
            if rank in self.ended:
                continue
            state = self.flags.get(rank, ("", 0.0))[0]
            if rank in self.cut or now - self.heard.get(rank, now) > UNREACHABLE_S:
                if state != RankState.UNREACHABLE:
                    self._flag(rank, RankState.UNREACHABLE, now, (
                        f"node {self.cut[rank]}'s relay went away: waiting for the rank to "
                        "report directly") if rank in self.cut else (
                        f"no report for {UNREACHABLE_S:.0f} s: its process stopped, its node "
                        "is down or the link is cut"))
                continue
            if state == RankState.UNREACHABLE:
                self._clear(rank, "reporting again")
            p = self.process.get(rank)
            if p is None or rank in self.flags:
                continue
            verdict = self.stalls.judge(Reading(rank, p.status, p.cpu_percent or 0.0,
                                                self.gpu_util.get(rank), silence.last,
                                                silence.longest), now)
            if verdict is not None:
                reason, fields = verdict
                self._flag(rank, RankState.STALLED, now, reason, **fields)
                self.ask_stacks(rank)
        self._stuck(now)

    def _stuck(self, now: float) -> None:
        """Ranks that wait in a collective for a rank that has ended: the job cannot go on (NCCL
        waits out its timeout, 10 minutes by default, and the launcher of those ranks with it)."""
        held = sorted(r for r, (state, _) in self.flags.items() if r not in self.ended
                      and state in (RankState.STALLED, RankState.WAITING))
        # A peer's death fails gloo's collectives at once, and NCCL's where the job aborts: only
        # ranks still held a moment later are stuck.
        dead = {r: why for r, (why, t) in self.ended.items()
                if why is not None and now - t >= STUCK_AFTER_S}
        said = (tuple(held), tuple(sorted(dead)))
        if not held or not dead or said == self._said_stuck:
            return
        self._said_stuck = said
        waited = {c for r in held for c in self.waiting.get(r, ("", []))[1]}
        first = min(dead, key=lambda r: (r not in waited, r))
        where = {self.waiting[r][0] for r in held if r in self.waiting}
        self.record(Notice(rank=PARENT, level="error", text=(
            f"{ranks_named(held)} {'waits' if len(held) == 1 else 'wait'}"
            f"{' ' + where.pop() if len(where) == 1 else ''} for rank {first}, which ended "
            f"({dead[first]}): the job cannot go on; K ends it")))

    def _blame(self) -> None:
        """Stalled ranks blocked in a collective while another is stuck elsewhere wait for it;
        the flight recorders name a rank that never entered the collective the others are in
        (DDP's all-reduce runs behind the Python, so stacks alone may not)."""
        stalled = {r: text for r, text in self.stacks.items()
                   if self.flags.get(r, ("",))[0] == RankState.STALLED}
        found = blame(stalled)
        found.update(behind(self.traces))
        for rank, (where, culprits) in found.items():
            if self.flags.get(rank, ("",))[0] != RankState.STALLED:
                continue
            names = ", ".join(f"{c} ({self.places[c]})" if c in self.places else str(c)
                              for c in culprits)
            self.flags[rank] = (RankState.WAITING, self.flags[rank][1])
            self.waiting[rank] = (f"in {where}", culprits)
            self.record(Rank(rank=rank, state=RankState.WAITING,
                             reason=f"in {where}: waiting for rank {names}", waiting_for=culprits))

    def _flag(self, rank: int, state: str, now: float, reason: str, **fields) -> None:
        self.flags[rank] = (state, now)
        self.record(Rank(rank=rank, state=state, reason=reason, **fields))

    def _clear(self, rank: int, reason: str) -> None:
        self.flags.pop(rank, None)
        self.stacks.pop(rank, None)
        self.traces.pop(rank, None)
        self.waiting.pop(rank, None)
        self.stalls.forget(rank)
        self.record(Rank(rank=rank, state=RankState.RUNNING, reason=reason))


def _the_scripts_own(ev: Output | Lines) -> bool:
    """Whether an output or lines event holds a line of the script's own: torch's and NCCL's
    logging is not its pace (asking a stalled rank for its flight recorder makes torch log)."""
    lines = ev.lines if isinstance(ev, Lines) else [ev.text]
    return any(not library_log(plain(line)) for line in lines)
