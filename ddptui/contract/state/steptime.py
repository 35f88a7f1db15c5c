"""Where each rank's step time goes, folded from its `phases` windows: the latest ones (for the
verdicts), its best window (its own baseline), the run's totals a phase (the end's report), its
memory epoch by epoch and its last windows', and the world's shares second by second (the
screen's chart: one entry a second, whatever the number of ranks).

Pure Python, fed under the run state's lock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ddptui.contract.protocol.codec import event_of
from ddptui.contract.protocol.events import Event, Rank
from ddptui.contract.protocol.steptime import PHASES, Phases, Verdict

RECENT = 5  # windows (about a second each) the live verdicts are taken over
MEMORY_LINE = 16  # windows of a rank's memory in use the screen draws
WORLD_S = 180  # seconds of the world's shares kept
WARM_WINDOWS = 2  # a rank's first windows (compiling, autotuning) are nobody's best


@dataclass
class RankTimes:
    """One rank's phases: the latest windows, its best, its totals since it began, its memory."""

    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    memory_line: deque = field(default_factory=lambda: deque(maxlen=MEMORY_LINE))  # MiB in use
    best: tuple[float, dict] | None = None  # (step ms, phase means) of its fastest window
    windows: int = 0
    steps: int = 0
    total_ms: dict = field(default_factory=dict)  # phase -> ms over every step read
    measured: list = field(default_factory=list)
    clock: str = ""
    memory: dict = field(default_factory=dict)  # the latest mem_ figures
    epoch_peaks: dict = field(default_factory=dict)  # epoch (or minute) -> (peak MiB, t0, t1)
    by_minute: bool = False  # the rank names no epochs: its peaks are minute by minute

    def add(self, ev: Phases, t0: float) -> None:
        # From a rank, or a record file: only the phases there are, in figures that can be
        means = {p: float(v[0]) for p, v in ev.phases.items() if p in PHASES and _pair(v)}
        self.recent.append((ev.steps, ev.step_ms, means))
        if ev.mem_allocated is not None and _finite(ev.mem_allocated):
            self.memory_line.append(ev.mem_allocated)
        self.windows += 1
        self.steps += ev.steps
        for p, ms in means.items():
            self.total_ms[p] = self.total_ms.get(p, 0.0) + ms * ev.steps
        self.measured, self.clock = [p for p in PHASES if p in ev.measured], ev.clock
        if self.windows > WARM_WINDOWS and ev.steps >= 2 and (
                self.best is None or ev.step_ms < self.best[0]):
            self.best = (ev.step_ms, means)
        if ev.mem_peak is not None and _finite(ev.mem_peak):
            self.memory = {k: getattr(ev, f"mem_{k}") for k in
                           ("kind", "allocated", "reserved", "peak", "limit")}
            self.by_minute = ev.epoch is None
            key = ev.epoch if ev.epoch is not None else int((ev.t - t0) // 60)
            peak, start, _ = self.epoch_peaks.get(key, (0.0, ev.t, ev.t))
            self.epoch_peaks[key] = (max(peak, ev.mem_peak), start, ev.t)
            while len(self.epoch_peaks) > 64:  # a long run: its last epochs say the trend
                del self.epoch_peaks[min(self.epoch_peaks)]

    def now(self) -> tuple[float, dict] | None:
        """(step ms, phase means) over the recent windows, weighted by their steps."""
        steps = sum(n for n, _, _ in self.recent)
        if not steps:
            return None
        means: dict[str, float] = {}
        for n, _, m in self.recent:
            for p, ms in m.items():
                means[p] = means.get(p, 0.0) + ms * n / steps
        return sum(n * ms for n, ms, _ in self.recent) / steps, means

    def shares(self) -> dict[str, float]:
        """Each phase's share of its time since it began, 0-1."""
        total = sum(self.total_ms.values())
        return {p: ms / total for p, ms in self.total_ms.items()} if total else {}


class StepTimes:
    """Every rank's RankTimes, and the rank states worth a line in the end's report."""

    def __init__(self):
        self.ranks: dict[int, RankTimes] = {}
        self.t0: float | None = None
        self.states: dict[str, int] = {}  # stalled, crashed, restarting, slow -> times entered
        self._state: dict[int, str] = {}  # each rank's last state
        self.verdict: Verdict | None = None  # the run's, once it ended
        self.world: dict[int, list] = {}  # second -> [windows, {phase: sum of their shares}]

    def take(self, ev: Event) -> None:
        """Any event of the run: its phases, its verdict, a rank's change of state."""
        if isinstance(ev, Phases):
            if not (ev.steps > 0 and _finite(ev.t, ev.step_ms, ev.step_p90_ms) and ev.step_ms > 0):
                return  # a window no rank of ours sends
            self.t0 = ev.t if self.t0 is None else self.t0
            rank = self.ranks.setdefault(ev.rank, RankTimes())
            rank.add(ev, self.t0)
            self._second(int(ev.t), rank.recent[-1])
        elif isinstance(ev, Verdict):
            self.verdict = ev
        elif isinstance(ev, Rank) and self._state.get(ev.rank) != ev.state:
            self._state[ev.rank] = ev.state
            if ev.state in ("stalled", "crashed", "restarting", "slow"):
                self.states[ev.state] = self.states.get(ev.state, 0) + 1

    def _second(self, second: int, window: tuple) -> None:
        """A window's shares into its second's sums (the world's chart)."""
        _, step, means = window
        n, sums = self.world.setdefault(second, [0, {}])
        self.world[second][0] = n + 1
        for p, ms in means.items():
            sums[p] = sums.get(p, 0.0) + ms / step
        if len(self.world) > WORLD_S:
            for old in sorted(self.world)[:len(self.world) - WORLD_S]:
                del self.world[old]

    def shares_by_second(self) -> list[dict[str, float]]:
        """The world's mean share of each phase, a second each, oldest first."""
        return [{p: total / n for p, total in sums.items()}
                for n, sums in (self.world[k] for k in sorted(self.world))]

    def dump(self) -> dict:
        """As JSON for a snapshot (contract/state/snapshot.py)."""
        return {"t0": self.t0, "states": self.states, "state_of": list(self._state.items()),
                "verdict": self.verdict.fields() if self.verdict else None,
                "world": list(self.world.items()),
                "ranks": [[slot, {**vars(r), "recent": list(r.recent),
                                  "memory_line": list(r.memory_line),
                                  "epoch_peaks": list(r.epoch_peaks.items())}]
                          for slot, r in self.ranks.items()]}

    @classmethod
    def load(cls, data: dict) -> StepTimes:
        times = cls()
        times.t0, times.states = data["t0"], dict(data["states"])
        times._state = {slot: state for slot, state in data["state_of"]}
        verdict = event_of(data["verdict"]) if data["verdict"] else None
        times.verdict = verdict if isinstance(verdict, Verdict) else None
        times.world = {second: value for second, value in data["world"]}
        for slot, r in data["ranks"]:
            times.ranks[slot] = RankTimes(**{
                **r, "recent": deque((tuple(w) for w in r["recent"]), maxlen=RECENT),
                "memory_line": deque(r["memory_line"], maxlen=MEMORY_LINE),
                "best": tuple(r["best"]) if r["best"] else None,
                "epoch_peaks": {k: tuple(v) for k, v in r["epoch_peaks"]}})
        return times

    def copy(self) -> dict[int, RankTimes]:
        """The ranks' figures for a reader outside the lock (its deques and dicts copied)."""
        return {slot: RankTimes(deque(r.recent, RECENT), deque(r.memory_line, MEMORY_LINE), r.best,
                                r.windows, r.steps, dict(r.total_ms), list(r.measured), r.clock,
                                dict(r.memory), dict(r.epoch_peaks), r.by_minute)
                for slot, r in self.ranks.items()}


def _pair(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
        for x in value)


def _finite(*values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)
