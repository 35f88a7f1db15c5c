"""Rank health from what the parent sees: which member of the world stopped making progress
(stalled), which only wait for it (waiting), and which is a straggler (slow) and why.

Pure: observations in, verdicts out; the supervisor gathers the observations and acts.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from ddptui.contract.protocol.events import Gpu
from ddptui.contract.stalls.scripts import FROZEN
from ddptui.contract.states import RankState

STALL_MIN_S = 10.0  # --stall-after's default floor ...
STALL_STEPS = 20  # ... or this many median steps, whichever is longer
FIRST_STEP_S = 60.0  # a process's first step may autotune or compile for a while
BEAT_SILENT_S = 3.0  # heartbeats come every 0.5 s: a process silent this long cannot run Python
SLOW_FACTOR = 1.15  # 15% slower than the median of the others
SLOW_WINDOW = 20  # steps each rank's figures are taken over
# Phases of the loop in which a rank mostly waits on nothing but itself (validation's last
# all_reduce is the exception, hence the tiers in judge_stalls).
LOCAL_PHASES = ("input", "checkpoint", "validate")


@dataclass
class Seen:
    """What the parent knows of one member of the world at one moment."""

    slot: int
    since: float  # its last finished step, or when it (re)entered the world
    step_s: float | None = None  # its median step time
    beat_t: float | None = None  # its last heartbeat
    global_step: int | None = None  # the step its loop is at (from the heartbeat: exact)
    phase: str = ""  # where its loop is (from the heartbeat)
    status: str = "running"  # the process, as psutil says
    cpu_percent: float = 0.0
    gpu_util: float | None = None  # its GPU's utilisation (None on CPU ranks)
    started: bool = True  # its process has finished a step


@dataclass(frozen=True)
class Verdict:
    state: str  # stalled | waiting
    reason: str
    fields: dict


def stall_limit(step_s: float | None, stall_after: float | None, started: bool = True) -> float:
    """Seconds without a finished step before a member counts as stalled. A process that has
    not finished its first step yet gets at least FIRST_STEP_S (cuDNN autotuning, compilation)."""
    limit = stall_after or (max(STALL_MIN_S, STALL_STEPS * step_s) if step_s else STALL_MIN_S)
    return limit if started else max(limit, FIRST_STEP_S)


def judge_stalls(members: list[Seen], now: float, stall_after: float | None) -> dict[int, Verdict]:
    """Verdicts for the members that are stuck, and for those waiting on them; empty when the
    world makes progress. A member is the culprit when its process is frozen, its heartbeat is
    silent, it is behind the others, or it is stuck in a phase of its own (input, checkpoint);
    when none of that singles one out, every stuck member is stalled."""
    stuck = [m for m in members if now - m.since > stall_limit(m.step_s, stall_after, m.started)]
    if not stuck:
        return {}
    furthest = max((m.global_step for m in members if m.global_step is not None), default=None)
    # The strongest evidence decides: a frozen or silent process outranks one that is behind,
    # which outranks one in a phase of its own (validation ends in a collective: a rank there
    # may only be waiting for a frozen peer).
    evidence = {m.slot: _why_culprit(m, now, furthest) for m in stuck}
    strongest = min((tier for tier, _ in evidence.values() if tier), default=0)
    if not strongest and len(stuck) < len(members) and all(
            now - m.since <= 2 * stall_limit(m.step_s, stall_after, m.started) for m in stuck):
        # Nothing singles out those stuck so far, and the world steps in lockstep: the others
        # stop within a step. A rank waiting in a collective crosses the limit first when its
        # last step was reported before the culprit's: wait for the culprit's evidence (seen
        # on a loaded CPU machine: the waiting rank killed by --on-stall recover).
        return {}
    culprits = [m for m in stuck if evidence[m.slot][0] == strongest] if strongest else stuck
    names = ", ".join(str(m.slot) for m in culprits)
    verdicts = {m.slot: _stalled(m, now, evidence[m.slot][1]) for m in culprits}
    for m in members:
        if m.slot not in verdicts:
            verdicts[m.slot] = Verdict(
                RankState.WAITING, f"waiting for rank {names}",
                {"waiting_for": [c.slot for c in culprits], "seconds": round(now - m.since, 1)})
    return verdicts


def _why_culprit(m: Seen, now: float, furthest: int | None) -> tuple[int, str]:
    """(how strong the evidence is, 1 strongest, 0 none; what it is)."""
    if m.status in FROZEN:
        return 1, f"process {m.status}"
    if m.beat_t is None or now - m.beat_t > BEAT_SILENT_S:
        return 1, "no heartbeat (the process runs no Python)"
    if furthest is not None and m.global_step is not None and m.global_step < furthest:
        return 2, f"behind the others (step {m.global_step} < {furthest})"
    if m.phase in LOCAL_PHASES:
        return 3, f"stuck in its own {m.phase}"
    return 0, ""


def _stalled(m: Seen, now: float, why: str) -> Verdict:
    seconds = round(now - m.since, 1)
    gpu = None if m.gpu_util is None else ("busy" if m.gpu_util >= 10 else "idle")
    parts = [f"no step for {seconds:.0f} s", f"process {m.status}", f"CPU {m.cpu_percent:.0f}%"]
    if gpu:
        parts.append(f"GPU {gpu}" + (" (a kernel that never ends?)" if gpu == "busy"
                                     else " (the host is stuck)"))
    if m.phase:
        parts.append(f"in {m.phase}")
    if why and not why.startswith("process"):
        parts.append(why)
    return Verdict(RankState.STALLED, ", ".join(parts), {
        "seconds": seconds, "process": m.status, "cpu_percent": m.cpu_percent, "gpu_activity": gpu,
        "phase": m.phase, "global_step": m.global_step})


class Stragglers:
    """Per-rank step figures over a sliding window of at least SLOW_WINDOW steps.

    Ranks of one world step in lockstep, so their step times match: what differs is the time
    each spends on its own before it can join the collective. The input wait is measured by
    every rank (data_wait); the GPU's clocks and its other processes come from NVML."""

    def __init__(self, window: int = SLOW_WINDOW):
        self.window = window
        self.recent: dict[int, deque] = {}  # slot -> (steps, step_ms, data_wait)

    def add(self, slot: int, steps: int, step_ms: float, data_wait: float) -> None:
        q = self.recent.setdefault(slot, deque())
        q.append((max(1, steps), step_ms, data_wait))
        while len(q) > 1 and sum(s for s, _, _ in q) - q[0][0] >= self.window:
            q.popleft()

    def forget(self, slot: int) -> None:
        """Its figures belong to another world (it left, or the world changed)."""
        self.recent.pop(slot, None)

    def figures(self, slot: int) -> tuple[float, float] | None:
        """(step ms, input ms per step) over the window, once it holds enough steps."""
        q = self.recent.get(slot)
        if not q or sum(s for s, _, _ in q) < self.window:
            return None
        steps = sum(s for s, _, _ in q)
        step_ms = sum(s * ms for s, ms, _ in q) / steps
        input_ms = sum(s * ms * wait for s, ms, wait in q) / steps
        return step_ms, input_ms

    def judge(self, members: list[int], gpus: dict[int, Gpu]) -> dict[int, str]:
        """slot -> the likely cause, for members slower than SLOW_FACTOR x the others' median.
        `gpus`: slot -> its latest NVML reading (held_down, others)."""
        figures = {s: f for s in members if (f := self.figures(s)) is not None}
        if len(figures) < 2:
            return {}
        slow = {}
        for slot, (step_ms, input_ms) in figures.items():
            others = [f for s, f in figures.items() if s != slot]
            step_med = statistics.median(f[0] for f in others)
            input_med = statistics.median(f[1] for f in others)
            # Its own time is the step less the time it waited for the others; in lockstep the
            # input wait is the part of it that differs from rank to rank.
            own_excess = input_ms - input_med
            if step_ms >= SLOW_FACTOR * step_med or own_excess >= (SLOW_FACTOR - 1) * step_med:
                slow[slot] = _cause(slot, step_ms, input_ms, input_med, step_med, gpus)
        return slow if len(slow) < len(figures) else {}


def _cause(slot: int, step_ms: float, input_ms: float, input_med: float, step_med: float,
           gpus: dict[int, Gpu]) -> str:
    if input_ms - input_med >= (SLOW_FACTOR - 1) * step_med:
        return (f"data-wait: {input_ms:.0f} ms a step waiting for input against "
                f"{input_med:.0f} ms on the others (its input pipeline)")
    return gpu_cause(gpus.get(slot)) or (
        f"compute: {step_ms:.0f} ms a step against {step_med:.0f} ms on the others")


def gpu_cause(gpu: Gpu | None) -> str:
    """What NVML says holds a rank's GPU back: its clocks, or another process on it."""
    if gpu is not None and gpu.held_down:
        return "GPU clocks held down: " + ", ".join(gpu.held_down)
    if gpu is not None and gpu.others:
        procs = ", ".join(f"pid {o[0]}" + (f" {o[3]} of {o[2]}" if len(o) > 3 else "") +
                          f" ({o[1]} MiB)" for o in gpu.others)
        return f"another process on its GPU: {procs}"
    return ""
