"""--autotune: early in the run, try input-pipeline settings one after another (each applied at
an agreed step, like the `a` key), measure each, and keep the fastest. Every trial is a row of
the epochs table; the verdict is a message in the log.
"""

from __future__ import annotations

import os
import time

from ddptui.contract.protocol.events import PARENT, Autotune

SETTLE_S = 2.0  # after a trial's settings land: new workers start, queues fill
MEASURE_S = 3.0
WARMUP_S = 3.0  # after the first step, before the first trial (cudnn autotuning, first batches)
MIN_READINGS = 3  # distinct throughput readings a trial needs, however long it takes


def candidates(settings: dict, cuda: bool, world_size: int) -> list[dict]:
    """Workers around the current count (half, same, double, within the host's cores per rank),
    each with and without the prefetcher on GPUs."""
    workers = settings["workers"]
    most = max(1, (os.cpu_count() or 2) // max(1, world_size))
    counts = sorted({max(0, workers // 2), workers, min(most, max(1, workers * 2))})
    prefetch = (True, False) if cuda else (settings["prefetch"],)
    return [{"workers": w, "prefetch": p} for p in prefetch for w in counts]


class Autotuner:
    """Driven by the supervisor's loop through tick(); acts through the supervisor's API."""

    def __init__(self, supervisor, trials: list[dict]):
        self.sup = supervisor
        self.trials = trials
        self.results: list[tuple[dict, float]] = []
        self.index = -1
        self.phase_end = 0.0
        self.samples: list[float] = []
        self.measuring = False
        self.done = False

    def tick(self, now: float | None = None) -> None:
        if self.done:
            return
        now = time.monotonic() if now is None else now
        view = self.sup.state.vitals()  # every supervisor tick: the cheap read
        if view.status != "running" or view.paused or not self.sup.world.idle():
            return
        if self.index < 0:
            if not self.phase_end:
                self.phase_end = now + WARMUP_S
                self.sup.say(f"autotune: {len(self.trials)} trials of the input pipeline "
                             f"(~{(SETTLE_S + MEASURE_S) * len(self.trials):.0f} s)")
            elif now >= self.phase_end:
                self._next(now)
            return
        if view.pending:  # the trial's settings have not landed yet
            self.phase_end = now + SETTLE_S
            return
        if not self.measuring:
            if now >= self.phase_end:
                self.measuring, self.samples, self.phase_end = True, [], now + MEASURE_S
            return
        # A reading counts once: on a loaded machine the same one stayed in place for a whole
        # short window, and two trials measured one figure.
        if not self.samples or view.throughput != self.samples[-1]:
            self.samples.append(view.throughput)
        if now >= self.phase_end and len(self.samples) >= MIN_READINGS:
            rate = sum(self.samples) / max(1, len(self.samples))
            self.results.append((self.trials[self.index], rate))
            self.sup.say(f"autotune trial {self.index + 1}/{len(self.trials)}: "
                         f"{describe_settings(self.trials[self.index])}: {rate:,.0f} img/s")
            self._next(now)

    def _next(self, now: float) -> None:
        self.index += 1
        self.measuring = False
        if self.index < len(self.trials):
            self._apply(self.trials[self.index])
            self.phase_end = now + SETTLE_S
            return
        best, rate = max(self.results, key=lambda r: r[1])
        self._apply(best)
        self.done = True
        tried = "; ".join(f"{describe_settings(s)} {r:,.0f}" for s, r in self.results)
        self.sup.record(Autotune(rank=PARENT, level="info", autotune=best,
                                  text=f"autotune kept {describe_settings(best)} ({rate:,.0f} "
                                       f"img/s; tried {tried})"))

    def _apply(self, settings: dict) -> None:
        current = self.sup.state.vitals().settings
        changes = {k: v for k, v in settings.items() if current.get(k) != v}
        if changes:
            self.sup.change_settings(**changes)
            self.sup.apply_now()


def describe_settings(settings: dict) -> str:
    return f"prefetch {'on' if settings['prefetch'] else 'off'}, {settings['workers']} workers"
