"""When the input pipeline holds the world back: the ranks that wait for data more than a tenth
of their step, and the knob most likely to help (p, W, w, --decode gpu), said once per change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddptui.contract.protocol.events import PARENT, InputWait, Step
from ddptui.contract.stalls.health import SLOW_WINDOW, Stragglers

INPUT_BOUND = 0.10  # of a step spent waiting for input: the input holds the rank back
KEEPS_UP = 0.05  # below this again, on every rank, it keeps up (apart: no flapping at 10%)
WINDOW = SLOW_WINDOW  # steps each rank's share is taken over, as the stragglers' figures
HOLD = 6  # checks (3 s) a change must hold before it is said: small steps swing


@dataclass(frozen=True)
class Pipeline:
    """What decides which knob could help: the settings in force and the host they share."""

    cuda: bool
    decode: str  # cpu | gpu
    files: bool  # samples decoded from image files (a JPEG folder)
    workers: int
    prefetch: bool
    ranks: int  # ranks sharing the host's cores
    cores: int


def knob(p: Pipeline, wait: float) -> tuple[str | None, str]:
    """(the key or option, why) most likely to help ranks that wait for their input `wait` of
    their step; None where no switch would: the input costs more than the host has."""
    share = max(1, p.cores // max(1, p.ranks))
    if p.workers == 0:
        return "W", "no DataLoader workers: each rank loads its batches between its steps"
    if p.cuda and not p.prefetch:
        return "p", "the prefetcher is off: each batch is copied to the GPU while the step waits"
    if p.decode == "gpu":
        if p.ranks > 1 and p.workers > 4:
            # 4 GPUs sharing 64 cores: 4 workers a rank fed nvJPEG 1.3x faster than 12
            # (docs/input-pipeline.md): the workers only read files, the ranks' threads need cores.
            return "w", (f"{p.workers} workers a rank only read files with --decode gpu, and "
                         f"{p.ranks} ranks' decoding threads share {p.cores} cores with them")
        return None, ("the GPU decodes the JPEGs in the time it would train: nothing to switch "
                      "live (docs/input-pipeline.md)")
    # Workers decode in parallel: keeping up takes workers / (1 - wait) of them.
    needed = math.ceil(round(p.workers / max(0.02, 1 - wait), 6))
    room = f"about {needed} would keep up, and the host has {share} cores for each rank"
    if needed < share:
        return "W", f"{p.workers} workers a rank; {room}"
    if p.cuda and p.files:
        return "--decode gpu", (f"{p.workers} workers a rank; {room}: a run with --decode gpu "
                                "decodes the JPEGs on the GPUs")
    if p.workers < share - 1:
        return "W", f"{p.workers} workers a rank; {room}"
    return None, f"{p.workers} workers a rank; {room}"


class InputWatch:
    """observe() every step event, fresh() when a rank's pipeline starts again, check() twice a
    second: an InputWait to say when the world becomes input-bound, or keeps up again."""

    def __init__(self, window: int = WINDOW, hold: int = HOLD):
        self.hold = hold
        self.recent = Stragglers(window)  # the same per-rank step window, minus pipeline starts
        self.skip: set[int] = set()  # slots whose next figures include a pipeline's start
        self.said: tuple | None = None  # input-bound, as said: (ranks, the pipeline then)
        self._streak: tuple[str | None, int] = (None, 0)  # (what is wanted, checks in a row)

    def observe(self, ev: Step) -> None:
        slot, steps = ev.rank, max(1, ev.steps or 1)
        # An epoch's first batch waits for the loader's workers to start: not the steady rate.
        if slot in self.skip or ev.step <= steps or ev.data_wait is None:
            self.skip.discard(slot)
            return
        self.recent.add(slot, steps, ev.step_ms or 0.0, ev.data_wait)

    def fresh(self, slots) -> None:
        """Their pipelines start again (settings applied, the world changed, a resume)."""
        for slot in slots:
            self.recent.forget(slot)
            self.skip.add(slot)

    def shares(self, members: list[int]) -> dict[int, float]:
        """slot -> share of its step spent waiting for input, for members with a full window."""
        out = {}
        for slot in members:
            if (figures := self.recent.figures(slot)) is not None:
                step_ms, input_ms = figures
                out[slot] = input_ms / step_ms if step_ms else 0.0
        return out

    def check(self, members: list[int], pipeline: Pipeline) -> InputWait | None:
        """What to say, once a change has held `hold` checks in a row."""
        shares = self.shares(members)
        if not members or len(shares) < len(members):
            return None
        waiting = sorted(s for s, w in shares.items() if w > INPUT_BOUND)
        worst = max(shares.values())
        wanted = self._wanted(worst, waiting, pipeline)
        held = self._streak[1] + 1 if wanted and self._streak[0] == wanted else 1
        self._streak = (wanted, held)
        if wanted is None or held < self.hold:
            return None
        self._streak = (None, 0)
        if wanted == "keeps up":
            self.said = None
            return InputWait(rank=PARENT, level="info",
                             input_wait={"ranks": [], "data_wait": round(worst, 3)},
                             text=f"input keeps up again: {100 * worst:.0f}% of a step at most "
                                  "waiting for data")
        self.said = (waiting, pipeline)
        key, why = knob(pipeline, worst)
        text = (f"input holds rank{'s' if len(waiting) > 1 else ''} "
                f"{', '.join(map(str, waiting))} back: up to {100 * worst:.0f}% of a step "
                f"waiting for data; " + (f"{key} may help: {why}" if key else why))
        return InputWait(rank=PARENT, level="warning", text=text,
                         input_wait={"ranks": waiting, "data_wait": round(worst, 3), "knob": key})

    def _wanted(self, worst: float, waiting: list[int], pipeline: Pipeline) -> str | None:
        """"bound" or "keeps up" where that is news, else None."""
        if self.said is None:
            return "bound" if waiting else None
        if pipeline != self.said[1]:  # a switch was made since: say how it went
            return "bound" if waiting else "keeps up"
        return "keeps up" if worst < KEEPS_UP else None
