"""Per-step telemetry rolled up, exactly to each figure's definition: a rank's steps over a
second become one step event (steps summed, rates over the whole span), its readings the last.
"""

from __future__ import annotations

import os

from ddptui.contract.protocol.events import Event, Gpu, Output, Process, Step
from ddptui.contract.protocol.steptime import Phases

ROLLUP_ENV = "DDPTUI_ROLLUP_S"
FULL_DETAIL_UP_TO = 16  # ranks: a job this size (two nodes of 8) keeps every step event
# Readings where the latest says all: a rank's GPU, its process, the last line it printed.
LATEST = (Gpu, Process, Output)
FOLDED = (Step, Phases, *LATEST)  # what a span folds: the rest keeps its place


def rollup_seconds() -> float:
    """How often a rank reporting to attach sends its telemetry: $DDPTUI_ROLLUP_S, else every
    step event for a job of up to FULL_DETAIL_UP_TO ranks, and once a second above."""
    text = os.environ.get(ROLLUP_ENV)
    if text:
        try:
            return max(0.0, float(text))
        except ValueError:
            pass
    world = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS") or "1"
    return 1.0 if world.isdigit() and int(world) > FULL_DETAIL_UP_TO else 0.0


def fold(batch: list[Event]) -> list[Event]:
    """A batch with each run of telemetry between two other events folded: one step event an
    epoch, one reading a device and kind, each where its last came. Anything else (a state
    change, an epoch's row, stacks) keeps its place, and nothing crosses it."""
    out: list[Event] = []
    run: list[Event] = []
    for ev in batch:
        if isinstance(ev, FOLDED):
            run.append(ev)
            continue
        out.extend(_fold_run(run))
        run = []
        out.append(ev)
    out.extend(_fold_run(run))
    return out


def _fold_run(run: list[Event]) -> list[Event]:
    last: dict[tuple, int] = {}  # what an event folds into -> the index of its last one
    merged: dict[tuple, Event] = {}
    for i, ev in enumerate(run):
        key = (type(ev), ev.rank, ev.epoch if isinstance(ev, (Step, Phases))
               else getattr(ev, "gpu", None))
        before = merged.get(key)
        if isinstance(ev, Step) and isinstance(before, Step):
            ev = merge_steps(before, ev)
        elif isinstance(ev, Phases) and isinstance(before, Phases):
            ev = merge_phases(before, ev)
        elif isinstance(ev, Gpu) and isinstance(before, Gpu) and ev.uuid is None:
            ev = ev.replace(uuid=before.uuid)  # said once a minute: not folded away
        merged[key] = ev
        last[key] = i
    return [merged[key] for key, _ in sorted(last.items(), key=lambda kv: kv[1])]


def merge_steps(a: Step, b: Step) -> Step:
    """Two step events of one rank and epoch as one: b's position, the figures over both."""
    na, nb = a.steps or 1, b.steps or 1
    steps = na + nb
    loss = _weighted([(a.loss, na), (b.loss, nb)])
    if a.step_ms is None or b.step_ms is None:  # read from output: no rates to combine
        return b.replace(steps=steps, loss=loss)
    ta, tb = a.step_ms * na, b.step_ms * nb  # ms each covers
    total = ta + tb
    if total <= 0:
        return b.replace(steps=steps, loss=loss)
    samples = [(x.samples_per_s or 0.0) * t / 1000 for x, t in ((a, ta), (b, tb))]
    wait = _weighted([(a.data_wait, ta), (b.data_wait, tb)])
    return b.replace(steps=steps, loss=loss, step_ms=round(total / steps, 3),
                     samples_per_s=round(sum(samples) * 1000 / total, 2)
                     if a.samples_per_s is not None and b.samples_per_s is not None else None,
                     data_wait=None if wait is None else round(wait, 4),
                     steps_per_s=round(steps * 1000 / total, 3)
                     if b.steps_per_s is not None else None)


def merge_phases(a: Phases, b: Phases) -> Phases:
    """Two windows of one rank and epoch as one: means over both (weighted by their steps), the
    higher 90th percentile, b's memory with the higher peak."""
    steps = a.steps + b.steps
    phases = {}
    for p in b.phases:
        pa, pb = a.phases.get(p, [0.0, 0.0]), b.phases[p]
        phases[p] = [round((pa[0] * a.steps + pb[0] * b.steps) / steps, 3), max(pa[1], pb[1])]
    return b.replace(steps=steps, phases=phases,
                     step_ms=round((a.step_ms * a.steps + b.step_ms * b.steps) / steps, 3),
                     step_p90_ms=max(a.step_p90_ms, b.step_p90_ms),
                     mem_peak=max(a.mem_peak or 0.0, b.mem_peak or 0.0) or None)


def _weighted(pairs: list[tuple[float | None, float]]) -> float | None:
    known = [(v, w) for v, w in pairs if v is not None]
    weight = sum(w for _, w in known)
    return sum(v * w for v, w in known) / weight if known and weight else None
