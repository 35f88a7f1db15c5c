"""A loss read without a device sync: summed where it lives, copied to pinned host memory behind
a CUDA event, and read an interval later (the built-in loop's step events, and run.step()).
"""

from __future__ import annotations

import torch


class LagMeter:
    """Losses summed where they are (one in-place add on the device a step, or floats); read()
    gives the mean of an earlier interval, copied to pinned memory behind an event, so it never
    syncs the device; epoch_mean() syncs once, at an epoch's end."""

    def __init__(self):
        self.sum: torch.Tensor | None = None
        self.n = 0  # steps summed in `sum` (or in floats) not yet copied out
        self.floats = 0.0
        self._pending: tuple[torch.Tensor, torch.cuda.Event, int] | None = None
        self._total, self._total_n = 0.0, 0  # read since the epoch began
        self.last: float | None = None

    def add(self, loss) -> None:
        """A tensor (any device, any float dtype) or a float: the same kind every step."""
        self.n += 1
        if not isinstance(loss, torch.Tensor):
            self.floats += float(loss)
            return
        value = loss.detach().reshape(())
        if self.sum is None or self.sum.device != value.device:
            self.sum = torch.zeros((), device=value.device)
        self.sum += value

    def read(self) -> float | None:
        """The latest interval's mean that has landed on the host (None before any)."""
        if self._pending is not None:
            if not self._pending[1].query():  # not landed: keep summing, copy once it has
                return self.last
            self._land()
        if not self.n:
            return self.last
        if self.sum is None or self.sum.device.type != "cuda":
            self._count(self.floats + (self.sum.item() if self.sum is not None else 0.0), self.n)
        else:
            host = torch.empty((), pin_memory=True)
            host.copy_(self.sum, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            self._pending = (host, done, self.n)
        self._restart()
        return self.last

    def epoch_mean(self) -> float | None:
        """The mean of every loss since the last call (one wait for the device)."""
        if self._pending is not None:
            self._pending[1].synchronize()
            self._land()
        if self.n:
            self._count(self.floats + (self.sum.item() if self.sum is not None else 0.0), self.n)
            self._restart()
        mean = self._total / self._total_n if self._total_n else None
        self._total, self._total_n = 0.0, 0
        return mean

    def _land(self) -> None:
        host, _done, n = self._pending
        self._pending = None
        self._count(host.item(), n)

    def _count(self, total: float, n: int) -> None:
        self._total += total
        self._total_n += n
        if n:
            self.last = total / n

    def _restart(self) -> None:
        self.n, self.floats = 0, 0.0
        if self.sum is not None:
            self.sum.zero_()
