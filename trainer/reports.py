"""What a rank reports beyond its steps: epoch rows (and the parts of epochs cut by a change, a
rollback or a quit), corrupt samples skipped, and what a world change cost.
"""

from __future__ import annotations

import time

import torch

from ddptui.contract.options.errors import DataError
from ddptui.contract.protocol import events
from ddptui.contract.wording import count
from ddptui_trainer.parts import Parts


def report_segment(p: Parts, epoch: int, partial: bool = False, world_size: int | None = None,
                   **extra) -> dict:
    """The `epoch` event for the steps since the segment began (a whole epoch, or the part of
    it before a settings or world change), so rows show img/s before and after a change."""
    ev = dict(epoch=epoch, start_step=p.state.segment_start, end_step=p.sampler.steps_done,
              partial=partial, settings=dict(p.state.settings),
              world_size=world_size or p.me.world_size, global_step=p.state.global_step,
              bad_samples=p.loaders.bad_in(epoch), **p.meter.epoch_summary())
    ev.update(extra)
    p.me.reporter.emit(events.Epoch(rank=p.me.reporter.rank, **ev))
    return ev


def report_kept(p: Parts, epoch: int, old_world: int, redone: int) -> None:
    """After a rollback: the row for what the old world trained up to the point it went back
    to (the steps after it are trained again and counted in the next row)."""
    kept = p.state.global_step - p.state.segment_global
    if p.sampler.epoch != epoch or kept <= 0:
        return
    batch = p.config.train.batch_size * old_world
    report_segment(p, epoch, partial=True, world_size=old_world, rolled_back=redone,
                   steps=kept, samples=kept * batch)


def report_bad(p: Parts) -> None:
    """Name each corrupt sample the loader skipped, once; without a supervisor to count them
    over every rank, end the run past --max-bad-samples."""
    bad = p.loaders.bad
    for path, why in bad.read():
        p.me.say(f"skipped corrupt sample {path}: {why} ({len(bad.seen)} on this rank, "
                 f"at most {bad.limit})", "warning", kind=events.BadSample,
                 bad_sample=len(bad.seen), path=path, limit=bad.limit)
        if not p.me.reporter.channel and len(bad.seen) > bad.limit:
            raise DataError(f"{len(bad.seen)} corrupt samples, more than --max-bad-samples "
                            f"{bad.limit}; the last: {path}")


def report_change(p: Parts) -> None:
    """How long the world change cost this rank, up to the end of its first step in the new
    world (one device sync, once per change, to time the step for real)."""
    if p.me.device.type == "cuda":
        torch.cuda.synchronize(p.me.device)
    now = time.time()
    seconds = now - p.state.changed_at
    marks = [("", p.state.changed_at), *p.state.change_marks, ("first_step", now)]
    phases = {name: round(t - before, 3)
              for (_, before), (name, t) in zip(marks, marks[1:], strict=False)}
    p.state.changed_at, p.state.change_marks = None, []
    p.me.reporter.emit(events.WorldCost(
        rank=p.me.reporter.rank, level="info", change_s=round(seconds, 3), phases=phases,
        world_size=p.me.world_size, global_step=p.state.global_step,
        text=f"first step on {count(p.me.world_size, 'rank')} {seconds:.2f} s after the world "
             "changed"))
