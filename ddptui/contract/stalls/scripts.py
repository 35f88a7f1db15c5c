"""Stall verdicts for the ranks of a script that tells ddptui nothing of its steps: what the
parent sees from outside (its process state, its CPU and GPU, its output) says it is stuck.

Pure: readings in, verdicts out; the script's run gathers the readings and acts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STALL_S = 60.0  # a script says nothing of its steps: silence this long before a verdict
FROZEN = ("stopped", "tracing-stop", "zombie", "dead", "disk-sleep")



IDLE_CPU = 5.0  # % of one core, the process tree together: a Python loop doing anything is above
IDLE_GPU = 10.0  # % utilisation
SILENCE_GAPS = 3  # silent this many times its longest gap between lines so far
# Before its first line a rank may be importing, or waiting in the rendezvous for a peer still
# importing on a loaded machine: idle that long counts only after this (as the built-in loop's
# first step, ddptui/contract/stalls/health.py).
FIRST_LINE_S = 60.0


@dataclass
class Reading:
    """One rank's process as the parent sees it now."""

    slot: int
    status: str  # psutil's: running, sleeping, stopped, disk-sleep, zombie...
    cpu_percent: float  # the process and its children
    gpu_util: float | None  # its GPU's utilisation; None for a CPU rank
    last_output_t: float | None  # its last line or step event; None before the first
    longest_gap: float  # the longest silence between two of its lines so far


class ScriptStalls:
    """judge() a reading every check; a verdict holds once its condition has held
    `stall_after` seconds without a break."""

    def __init__(self, stall_after: float):
        self.stall_after = stall_after
        self._frozen: dict[int, float] = {}  # slot -> since when
        self._idle: dict[int, float] = {}

    def forget(self, slot: int) -> None:
        self._frozen.pop(slot, None)
        self._idle.pop(slot, None)

    def judge(self, r: Reading, now: float) -> tuple[str, dict] | None:
        """(why it is stalled, the fields of its `rank` event), or None while it is not."""
        frozen = _since(self._frozen, r.slot, r.status in FROZEN, now)
        idle = _since(self._idle, r.slot, r.cpu_percent < IDLE_CPU and (
            r.gpu_util is None or r.gpu_util < IDLE_GPU), now)
        gpu = None if r.gpu_util is None else ("busy" if r.gpu_util >= IDLE_GPU else "idle")
        fields = {"process": r.status, "cpu_percent": r.cpu_percent, "gpu_activity": gpu}
        silent = now - r.last_output_t if r.last_output_t is not None else 0.0
        limit = max(self.stall_after, SILENCE_GAPS * r.longest_gap)
        if idle is not None and r.last_output_t is not None:
            idle = max(idle, r.last_output_t)  # a rank that prints is not idle, however cool
        if frozen is not None:  # the strongest evidence: it says why it is idle or silent
            since = min(frozen, idle if idle is not None else frozen)
            if now - since >= self.stall_after:
                return (f"process {r.status} for {now - since:.0f} s",
                        {**fields, "seconds": round(now - since, 1), "cause": "stopped"})
            return None
        idle_limit = self.stall_after if r.last_output_t is not None else \
            max(self.stall_after, FIRST_LINE_S)
        if idle is not None and now - idle >= idle_limit:
            gpu_text = "" if gpu is None else f", GPU {gpu}"
            return (f"idle for {now - idle:.0f} s (CPU {r.cpu_percent:.0f}%{gpu_text})",
                    {**fields, "seconds": round(now - idle, 1), "cause": "idle"})
        if r.last_output_t is not None and silent >= limit:
            return (f"no output for {silent:.0f} s (its longest silence before: "
                    f"{r.longest_gap:.0f} s; CPU {r.cpu_percent:.0f}%"
                    + ("" if gpu is None else f", GPU {gpu}") + ")",
                    {**fields, "seconds": round(silent, 1), "cause": "silent"})
        return None


def _since(table: dict[int, float], slot: int, holds: bool, now: float) -> float | None:
    if holds:
        return table.setdefault(slot, now)
    table.pop(slot, None)
    return None


# Where a frame's code comes from: an installed package, the standard library or torch (a
# checkout's too) are libraries; anything else is the script's own code.
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python\d|/torch/|^<frozen ")
# Frames that only pass a call on to the module they wrap: reached from inside, the rank is in
# that module's code, not in the wrapper's collective.
_PASSING_ON = {"forward", "_run_ddp_forward", "_call_impl", "_wrapped_call_impl", "__call__"}


def blocked_in_collective(stacks: str) -> str | None:
    """The collective the main thread is blocked in, wherever it was called from: torch.distributed
    (a library's all-reduce, FSDP, an optimizer's), DDP's own (its buffers' broadcast in forward,
    its reducer), or DDP's gradient all-reduce inside backward. Read from the innermost frame
    out through library code: a frame of the script's own first means it is not in one."""
    blocks = [b for b in stacks.split("\n\n") if "most recent call first" in b]
    if not blocks:
        return None
    for line in blocks[-1].splitlines()[1:]:  # the main thread comes last, innermost first
        line = line.strip().replace("\\", "/")
        if " in " not in line or not line.startswith("File "):
            continue
        path = line.removeprefix('File "').split('"', 1)[0]
        where = line.rsplit(" in ", 1)[1]
        if where in _PASSING_ON:
            return None
        if "torch/distributed/" in path:
            return where
        if "torch/nn/parallel/distributed.py" in path:
            return f"{where} (DDP)"
        if "torch/autograd/" in path:
            return "backward (DDP's gradient all-reduce)"
        if not _LIBRARY.search(path):
            return None
    return None


def blame(stacks: dict[int, str], frozen: set[int] | frozenset[int] = frozenset()
          ) -> dict[int, tuple[str, list[int]]]:
    """Among stalled ranks with their stacks: those blocked in a collective while another is
    stuck elsewhere (its own code, or `frozen`: a stopped process, which gives no stacks) wait
    for it: slot -> (where it waits, the culprits)."""
    blocked = {slot: blocked_in_collective(text) for slot, text in stacks.items()
               if slot not in frozen}
    culprits = sorted({slot for slot, where in blocked.items() if where is None} | set(frozen))
    if not culprits:
        return {}  # every one is in a collective: none can be told from the others
    return {slot: (where, culprits) for slot, where in blocked.items() if where is not None}


class Silence:
    """When a rank last said something, and its longest silence so far; `announce`: its first
    word says it runs (not a standby's: it stays out of the world until it joins)."""

    def __init__(self, now: float, announce: bool = True):
        self.last: float | None = None
        self.longest = 0.0
        self.started = now
        self.announce = announce

    def heard(self, now: float) -> None:
        if self.last is not None:
            if now <= self.last:  # sent before what came first (a backlog, out of order)
                return
            self.longest = max(self.longest, now - self.last)
        self.last = now
