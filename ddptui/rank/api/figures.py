"""What a script's run reports of its progress: step events a few times a second (the loss read
an interval late, never now), and epoch rows, cut into parts where `a` put settings in force.
"""

from __future__ import annotations

import time

from ddptui.contract.protocol import events
from ddptui.rank.telemetry.lagmeter import LagMeter
from ddptui.rank.telemetry.reporter import Reporter, row_figures

# run.log() names that fill the epochs table's columns (the rest show beside the row)
ALIASES = {"val_loss": "val_loss", "eval_loss": "val_loss", "valid_loss": "val_loss",
           "val_acc": "val_acc", "val_accuracy": "val_acc", "eval_accuracy": "val_acc",
           "eval_acc": "val_acc"}


class Figures:
    """Counts steps and samples since the last step event, the epoch and its current part.
    `waited` arguments: the seconds the loop waited for data since the last call."""

    def __init__(self, reporter: Reporter, interval: float):
        self.reporter, self.interval = reporter, interval
        self.meter = LagMeter()
        self.epoch: int | None = None
        self.open = False  # an epoch began and has no row yet
        self.begin_interval()
        self.begin_epoch(None, 0)

    def counted(self, samples: int, loss) -> None:
        """A step done: `loss` a tensor (read later) or a float or None."""
        self.steps += 1
        self.samples += samples
        self.segment_samples += samples
        if loss is not None:
            self.meter.add(loss)

    def due(self, now: float, global_step: int) -> bool:
        return now - self.start >= self.interval or global_step == 1  # the first at once

    def begin_interval(self) -> None:
        self.start, self.steps, self.samples = time.perf_counter(), 0, 0

    def begin_epoch(self, epoch: int | None, global_step: int) -> None:
        self.epoch, self.open = epoch, epoch is not None
        self.epoch_steps0 = global_step
        self.values: dict[str, float] = {}
        self.begin_segment(global_step)

    def begin_segment(self, global_step: int) -> None:
        """An epoch row's span: the epoch, or the part of it since `a` put settings in force."""
        self.segment_start, self.segment_steps0 = time.perf_counter(), global_step
        self.segment_samples, self.segment_waited = 0, 0.0

    def log(self, name: str, value: float) -> None:
        self.values[ALIASES.get(name, name)] = value

    def rewind(self, global_step: int) -> None:
        """Back to a rollback point: the epoch and its part begin no later than it."""
        self.epoch_steps0 = min(self.epoch_steps0, global_step)
        self.segment_steps0 = min(self.segment_steps0, global_step)
        self.begin_interval()

    def send_step(self, now: float, global_step: int, waited: float) -> None:
        self.segment_waited += waited
        if not self.steps:
            return
        elapsed = max(now - self.start, 1e-9)
        self.reporter.emit(events.Step(rank=self.reporter.rank,
                                       epoch=self.epoch or 0, step=global_step - self.epoch_steps0,
                           global_step=global_step, loss=self.meter.read(), steps=self.steps,
                           samples_per_s=round(self.samples / elapsed, 2),
                           step_ms=round(1000 * elapsed / self.steps, 3),
                           data_wait=round(min(1.0, waited / elapsed), 4)))
        self.begin_interval()

    def end_epoch(self, global_step: int, settings: dict, world_size: int,
                  waited: float) -> None:
        if not self.open:
            return
        self.open = False
        values = dict(self.values)
        self.end_segment(global_step, False, settings, world_size, waited,
                         val_loss=values.pop("val_loss", None),
                         val_acc=values.pop("val_acc", None), metrics=values)

    def end_segment(self, global_step: int, partial: bool, settings: dict, world_size: int,
                    waited: float, **extra) -> None:
        """The `epoch` event for the steps since the part began, as the built-in trainer's."""
        self.segment_waited += waited  # the steps since the last step event count too
        self.reporter.emit(events.Epoch(rank=self.reporter.rank,
                                        epoch=self.epoch, steps=global_step - self.segment_steps0,
                           start_step=self.segment_steps0 - self.epoch_steps0,
                           end_step=global_step - self.epoch_steps0, partial=partial,
                           settings=settings, train_loss=self.meter.epoch_mean(),
                           world_size=world_size, **extra,
                           **row_figures(self.segment_samples,
                                         time.perf_counter() - self.segment_start,
                                         self.segment_waited)))
