"""A rank's step clock: the loop (or the hooks in instrument.py) says which phase of the step
begins; the clock adds up each phase's time a step and sends a window of steps about once a
second as a `phases` event, with the rank's memory.

On a GPU each mark is a CUDA event on the current stream, read once the GPU has passed it
(`query()`, never a wait): the phases are the GPU's timeline, a few steps late. On a CPU, host
clocks. Marks cost a clock read or an event record; nothing here syncs or prints.
"""

from __future__ import annotations

import os
import resource
import time
from collections import deque
from collections.abc import Callable

import torch

from ddptui.contract.protocol.steptime import PHASES, Phases

EVERY_S = 1.0  # a window a second
MAX_BEHIND = 64  # steps whose CUDA events the GPU has not reached yet: past this, steps go untimed
MAX_MARKS = 64  # marks in one step: more (an optimizer torch.optim does not see) drops the step
MIB = 1 << 20


class StepClock:
    """`begin(phase)` closes the phase in course and opens `phase`; `step_end()` closes the step
    (the optimizer's step returned). `send(event)` gets each window's Phases."""

    def __init__(self, rank: int, send: Callable[[Phases], None], device: torch.device | None = None,
                 measured: tuple[str, ...] = PHASES, every_s: float = EVERY_S):
        self.rank, self.send, self.every_s = rank, send, every_s
        self.cuda = device if device is not None and device.type == "cuda" else None
        self.measured = [p for p in PHASES if p in measured or p == "rest"]
        self.phase = "rest"
        # Inside optimizer.step(): a closure (Lightning's, LBFGS's) runs forward and backward
        # there, and what follows its backward is the optimizer's, not rest.
        self.stepping = False
        self.epoch: int | None = None
        self.global_step = 0
        self.window: list[dict[str, float]] = []  # the steps read since the last window was sent
        self.sent_t = time.perf_counter()
        self._limit = _memory_limit(self.cuda)
        if self.cuda is None:
            self._t = time.perf_counter()
            self._step: dict[str, float] = {}
        else:
            self._pool: list = []
            self._start = self._event()  # the step's first mark: the last one's end
            self._start.record(torch.cuda.current_stream(self.cuda))
            self._marks: list[tuple[str, object]] = []  # (phase that ended, its end's event)
            self._behind: deque = deque()  # (start, marks) of steps the GPU has not passed
            self._read = 0  # steps read

    # -- marks (the hot loop, hooks on the autograd thread) ---------------------------------
    def begin(self, phase: str) -> None:
        if phase == self.phase:
            return
        if self.cuda is None:
            now = time.perf_counter()
            self._step[self.phase] = self._step.get(self.phase, 0.0) + now - self._t
            self._t = now
        elif len(self._behind) < MAX_BEHIND and not torch.cuda.is_current_stream_capturing():
            if len(self._marks) >= MAX_MARKS:  # no step ends: not a step we can tell apart
                self.restart()
            event = self._event()
            event.record(torch.cuda.current_stream(self.cuda))  # (the current device may differ)
            self._marks.append((self.phase, event))
        self.phase = phase

    def step_end(self) -> None:
        """The optimizer stepped: the step's phases are complete (the next one starts in
        `rest`)."""
        self.begin("rest")
        self.global_step += 1
        if self.cuda is None:
            if self.global_step > 1:  # the first began when the clock was made, not at a step
                self.window.append(self._step)
            self._step = {}
        else:
            self._close_cuda_step()
        now = time.perf_counter()
        if now - self.sent_t >= self.every_s:
            self.flush(now)

    def restart(self) -> None:
        """The time since the last step's end was no step's (validation, a checkpoint, the
        epoch's end): the next step starts now."""
        self.phase = "rest"
        if self.cuda is None:
            self._step, self._t = {}, time.perf_counter()
            return
        self._pool.extend(event for _, event in self._marks)
        self._marks = []
        self._new_start()

    def flush(self, now: float | None = None) -> None:
        """Send the steps read so far as one window (at the window's end, and at exit)."""
        if self.cuda is not None:
            self._read_passed()
        self.sent_t = now or time.perf_counter()
        if not self.window:
            return
        steps, self.window = self.window, []
        totals = [sum(s.values()) for s in steps]
        self.send(Phases(
            rank=self.rank, steps=len(steps), step_ms=_ms(sum(totals) / len(totals)),
            step_p90_ms=_ms(_p90(totals)),
            phases={p: [_ms(sum(s.get(p, 0.0) for s in steps) / len(steps)),
                        _ms(_p90([s.get(p, 0.0) for s in steps]))] for p in self.measured},
            measured=list(self.measured), clock="cuda" if self.cuda is not None else "host",
            global_step=self.global_step, epoch=self.epoch, **self.memory()))

    # -- CUDA events, read late ---------------------------------------------------------------
    def _event(self):
        if self._pool:
            return self._pool.pop()
        return torch.cuda.Event(enable_timing=True)

    def _close_cuda_step(self) -> None:
        if self._marks:
            self._behind.append((self._start, self._marks))
            self._start, self._marks = self._marks[-1][1], []
        else:  # a step left untimed (the GPU too far behind): the next one starts here
            self._new_start()
        self._read_passed()

    def _new_start(self) -> None:
        """A new event starts the next step: the old one may still end a step not read yet."""
        self._start = self._event()
        self._start.record(torch.cuda.current_stream(self.cuda))

    def _read_passed(self) -> None:
        """The steps whose last event the GPU has passed: their phases in seconds, and their
        events back to the pool (a step's last event stays: it starts the next step)."""
        # every mark: one on another stream (the autograd thread's) may not be passed yet
        while self._behind and all(event.query() for _, event in self._behind[0][1]):
            start, marks = self._behind.popleft()
            phases: dict[str, float] = {}
            before = start
            for phase, event in marks:
                phases[phase] = phases.get(phase, 0.0) + before.elapsed_time(event) / 1000
                before = event
            self._read += 1
            if self._read > 1:  # the first began when the clock was made, not at a step
                self.window.append(phases)
            self._pool.append(start)
            self._pool.extend(event for _, event in marks[:-1])

    # -- memory ---------------------------------------------------------------------------------
    def memory(self) -> dict:
        """The rank's memory as the Phases event's mem_ fields."""
        if self.cuda is not None:
            return {"mem_kind": "cuda",
                    "mem_allocated": _mib(torch.cuda.memory_allocated(self.cuda)),
                    "mem_reserved": _mib(torch.cuda.memory_reserved(self.cuda)),
                    "mem_peak": _mib(torch.cuda.max_memory_allocated(self.cuda)),
                    "mem_limit": self._limit}
        return {"mem_kind": "rss", "mem_allocated": _mib(_rss()),
                "mem_peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "mem_limit": self._limit}


class NoClock(StepClock):
    """The step clock turned off: marks cost a method call."""

    def __init__(self):  # (no super().__init__: none of the clock's state is needed)
        self.epoch, self.stepping = None, False

    def begin(self, phase: str) -> None:
        pass

    def step_end(self) -> None:
        pass

    def restart(self) -> None:
        pass

    def flush(self, now: float | None = None) -> None:
        pass


def _memory_limit(cuda: torch.device | None) -> float | None:
    """The GPU's memory; on a CPU, the machine's memory shared by the ranks of this node."""
    if cuda is not None:
        return _mib(torch.cuda.get_device_properties(cuda).total_memory)
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    return _mib(total / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1))))


def _rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 3)


def _mib(n: float) -> float:
    return round(n / MIB, 1)
