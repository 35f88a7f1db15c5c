"""The events of where step time goes: each rank's phases of a step and its memory, a window at a
time, and the verdict a run leaves at its end. Registered in the events' family (events.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ddptui.contract.protocol.events import EVENTS, Event
from ddptui.contract.protocol.wire import doc

# The phases of a step, in the order a step runs them; they add up to the step's time.
PHASES = ("data", "h2d", "forward", "backward", "comm", "optimizer", "rest")


@EVENTS.register("phases")
@dataclass(frozen=True, kw_only=True, slots=True)
class Phases(Event):
    """A rank's steps over a window (about a second): where their time went, phase by phase, and
    its memory. Measured with CUDA events read a few steps late on a GPU, host clocks on a CPU;
    sent by the rank (the built-in loop, `ddptui.init()`) or read from a script's record file."""

    steps: int = doc("steps in the window")
    step_ms: float = doc("their mean time, ms")
    step_p90_ms: float = doc("their 90th percentile, ms")
    phases: dict = doc("phase -> [mean ms, p90 ms]: data (waiting for input), h2d (copy to the "
                       "device), forward, backward, comm (waiting for the others: the all-reduce "
                       "not hidden by backward, DDP's buffer broadcast before forward), "
                       "optimizer, rest (the loop's own code between them)")
    measured: list = doc("the phases this rank can tell apart; the others' time is in rest")
    clock: Literal["cuda", "host"] = doc("CUDA events (the GPU's timeline) or host clocks")
    global_step: int | None = doc("the rank's steps since it began, at the window's end", None)
    epoch: int | None = doc("its epoch, where it is known", None)
    mem_kind: Literal["cuda", "rss"] | None = doc("cuda: the caching allocator's figures; rss: "
                                                  "the process's resident memory (a CPU rank)",
                                                  None)
    mem_allocated: float | None = doc("memory in use now, MiB", None)
    mem_reserved: float | None = doc("cuda: memory the allocator holds, MiB", None)
    mem_peak: float | None = doc("the highest memory in use since the rank began, MiB", None)
    mem_limit: float | None = doc("what it can have at most (the GPU's memory; a CPU rank's "
                                  "share of the machine's), MiB", None)


@EVENTS.register("verdict")
@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict(Event):
    """The run's end: where its time went, per rank and overall, its slowest rank and why, its
    memory peaks, restarts and stalls, and the settings it ran under (`ddptui report`)."""

    lines: list = doc("the verdict as it is printed, a line each")
    report: dict = doc("the same as figures: `ddptui report --json`")
