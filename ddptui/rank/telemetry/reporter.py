"""Where a rank's telemetry goes: the supervisor's pipe, a JSONL log, or both.

Also the StepMeter, which aggregates steps between sends and reads the loss one interval late,
so reporting never adds a host/device synchronisation to the training step.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch

from ddptui.contract.jsonl import JsonlWriter
from ddptui.contract.protocol import events
from ddptui.contract.protocol.codec import encode
from ddptui.rank.telemetry.buffer import EventBuffer
from ddptui.rank.telemetry.lagmeter import LagMeter


class ChannelSender:
    """Sends events to the supervisor's pipe (a multiprocessing Connection) from a thread."""

    def __init__(self, conn, limit: int = 10_000):
        self.conn = conn
        self.buffer = EventBuffer(limit)
        self.thread = threading.Thread(target=self._feed, name="telemetry-feeder", daemon=True)
        self.thread.start()

    def put(self, ev: events.Event) -> None:
        self.buffer.put(ev)

    def _feed(self) -> None:
        while (taken := self.buffer.take()) is not None:
            try:
                for ev in taken[0]:
                    self.conn.send_bytes(encode(ev).encode())
            except (OSError, ValueError):  # the supervisor is gone; we are about to be too
                return

    def close(self) -> None:
        self.buffer.close()
        self.thread.join(timeout=5)
        self.conn.close()


class Reporter:
    """Emits events for one rank; thread-safe (the device sampler thread shares it)."""

    def __init__(self, rank: int, channel=None, log_path: str | None = None):
        self.rank = rank
        self.channel = ChannelSender(channel) if channel is not None else None
        self.writer = JsonlWriter(log_path) if log_path else None
        self.sinks: list = []  # more consumers of every event: a dashboard link, TensorBoard

    def emit(self, ev: events.Event) -> None:
        """`ev` to every place this rank's events go (its rank is this reporter's `rank`)."""
        if self.channel is not None:
            self.channel.put(ev)
        if self.writer is not None:
            self.writer.write(ev)
        for sink in self.sinks:
            sink.put(ev)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.channel is not None:
            self.channel.close()  # flushes what the feeder still holds
        for sink in self.sinks:
            sink.close()


def row_figures(samples: int, seconds: float, waited: float) -> dict:
    """An epoch row's rates, the same for the built-in loop and your script: `waited` seconds of
    the row's `seconds` went to waiting for input."""
    seconds = max(seconds, 1e-9)
    return {"samples": samples, "seconds": round(seconds, 3),
            "samples_per_s": round(samples / seconds, 2),
            "data_wait": round(min(1.0, waited / seconds), 4)}


class StepMeter:
    """Counts steps, samples and input wait; emits at most `hz` step events a second, each with
    the loss of an interval earlier (LagMeter: never a device sync)."""

    def __init__(self, reporter: Reporter, hz: float, batch_size: int, device: torch.device,
                 progress: Callable[[], float] = lambda: 0.0):
        self.reporter = reporter
        self.progress = progress  # the fraction of the epoch done, whatever the world size
        self.enabled = hz > 0  # 0: no step events (epoch summaries still), to measure our cost
        self.interval = 1.0 / hz if hz > 0 else 0.0
        self.batch_size = batch_size
        self.loss = LagMeter()
        self.epoch_loss_sum = torch.zeros((), device=device)  # exact, read once at its end
        self.reset_epoch()
        self._begin_interval()
        self._sent_any = False

    def reset_epoch(self) -> None:
        self.epoch_steps = 0
        self.epoch_wait = 0.0
        self.epoch_start = time.perf_counter()
        self.epoch_loss_sum.zero_()

    def _begin_interval(self) -> None:
        self.steps = 0
        self.wait = 0.0
        self.start = time.perf_counter()

    def waited(self, seconds: float) -> None:
        self.wait += seconds
        self.epoch_wait += seconds

    def step(self, loss: torch.Tensor, epoch: int, step: int, global_step: int) -> bool:
        """Count a step; True when it sent a step event (a moment to report other news)."""
        loss = loss.detach()
        self.loss.add(loss)
        self.epoch_loss_sum += loss
        self.steps += 1
        self.epoch_steps += 1
        if not self.enabled:
            return False
        now = time.perf_counter()
        if self._sent_any and now - self.start < self.interval:
            return False
        self._sent_any = True
        elapsed = max(now - self.start, 1e-9)
        self.reporter.emit(events.Step(
            rank=self.reporter.rank, epoch=epoch, step=step, global_step=global_step,
            loss=self.loss.read(), steps=self.steps, progress=round(self.progress(), 5),
            samples_per_s=round(self.steps * self.batch_size / elapsed, 2),
            step_ms=round(1000 * elapsed / self.steps, 3),
            data_wait=round(min(1.0, self.wait / elapsed), 4)))
        self._begin_interval()
        return True

    def epoch_summary(self) -> dict:
        """Figures for the `epoch` event; one sync at the epoch's end is fine."""
        steps = max(self.epoch_steps, 1)
        return {"train_loss": self.epoch_loss_sum.item() / steps, "steps": self.epoch_steps,
                **row_figures(self.epoch_steps * self.batch_size,
                              time.perf_counter() - self.epoch_start, self.epoch_wait)}
