"""A thread that wakes every millisecond: the time it lost waiting is time another thread of the
process held the GIL. Shared by bench/decode_probe.py and bench/launch_gil.py.
"""

from __future__ import annotations

import threading
import time

TICK_S = 0.001


class Ticker(threading.Thread):
    """Started on construction; stop() ends it. `waited`: seconds lost beyond its ticks in all;
    `longest`: the longest gap between two wake-ups, ending at `longest_at` (perf_counter)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.waited = self.longest = self.longest_at = 0.0
        self._halt = False
        self.start()

    def run(self) -> None:
        last = time.perf_counter()
        while not self._halt:
            time.sleep(TICK_S)
            now = time.perf_counter()
            self.waited += max(0.0, now - last - 1.1 * TICK_S)
            if now - last > self.longest:
                self.longest, self.longest_at = now - last, last
            last = now

    def stop(self) -> None:
        self._halt = True
        self.join()
