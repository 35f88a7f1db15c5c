"""The rank's heartbeat: a daemon thread that says twice a second where the training loop is
(its phase and exact global step), so the parent can tell a hung rank from one that waits for it.

The loop only assigns two attributes of a Pulse; nothing here touches the device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ddptui.contract.protocol.events import Beat


class Pulse:
    """Where the loop is: written by the training thread, read by the heartbeat."""

    def __init__(self):
        self.phase = "starting"
        self.step = 0


class Heartbeat(threading.Thread):
    """Calls emit(Beat(...)) for rank `rank` every `interval` seconds until stopped."""

    def __init__(self, pulse: Pulse, rank: int, emit: Callable[[Beat], None],
                 interval: float = 0.5):
        super().__init__(name="heartbeat", daemon=True)
        self.pulse, self.rank, self.emit, self.interval = pulse, rank, emit, interval
        self._halt = threading.Event()

    def run(self) -> None:
        since, last = time.time(), None
        while not self._halt.wait(self.interval):
            now = (self.pulse.phase, self.pulse.step)
            if now != last:
                since, last = time.time(), now
            self.emit(Beat(rank=self.rank, phase=now[0], global_step=now[1],
                           phase_s=round(time.time() - since, 1)))

    def stop(self) -> None:
        self._halt.set()
