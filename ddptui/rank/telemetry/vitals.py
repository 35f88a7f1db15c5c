"""A rank's signs of life that need no output: the optimizer steps it takes (every torch
optimizer, through torch's global step hook) and whether its main thread moves on, written twice
a second to a small file that its run reads (ddptui/contract/observe/vitals.py).

A rank that trains and prints nothing (most scripts print on rank 0 alone) is not stalled; one
asleep, deadlocked or blocked in a collective takes no step and its main thread stays where it
is. Nothing here touches the device or sends anything; the step hook only counts.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque

from ddptui.contract.observe.vitals import PHASES_KEPT, PHASES_RECORD, vitals_record
from ddptui.contract.protocol.codec import encode
from ddptui.rank.patching import after_import

EVERY_S = 0.5


class Vitals(threading.Thread):
    """Counts optimizer steps (`step`, torch's hook) and moves of the main thread, and writes
    both to `path` every EVERY_S while they change."""

    def __init__(self, path: str, phases_path: str | None = None):
        super().__init__(name="ddptui-vitals", daemon=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        # The step clock's latest window (instrument.py), written here: no I/O in the loop.
        self.phases_fd = os.open(phases_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) \
            if phases_path else None
        self.phases: deque[bytes] = deque(maxlen=PHASES_KEPT)  # the newest windows, encoded
        self._phases_changed = False
        self.steps = 0
        self.moves = 0
        self._main = threading.main_thread().ident
        self._seen: dict[int, tuple[object, int]] = {}  # id(frame) -> (its code, its line)

    def step(self, *_args) -> None:
        """torch.optim's global step post hook: (optimizer, args, kwargs)."""
        self.steps += 1

    def hold_phases(self, ev) -> None:
        """A window of the step clock's, for the next write (the training thread's call). The
        record keeps the newest few: the run reads it at its own pace, and skips none."""
        self.phases.append(encode(ev).encode())
        self._phases_changed = True

    def write_phases(self) -> None:
        """The windows held now, written at once (at exit: the run reads them as it ends)."""
        if not self._phases_changed or self.phases_fd is None:
            return
        self._phases_changed = False
        record = b"".join(list(self.phases))
        while len(record) >= PHASES_RECORD:  # a window of many phases: the newest that fit
            record = record[record.index(b"\n") + 1:]
        try:
            os.pwrite(self.phases_fd, record.ljust(PHASES_RECORD), 0)
        except OSError:
            pass

    def run(self) -> None:
        written = None
        while True:
            time.sleep(EVERY_S)
            self.moves += self._moved()
            now = (self.steps, self.moves)
            self.write_phases()
            if now != written:
                written = now
                try:
                    os.pwrite(self.fd, vitals_record(*now), 0)
                except OSError:  # its folder went away with the run: nobody reads it
                    return

    def _moved(self) -> bool:
        """Whether a frame of the main thread that was there at the last look has run on to
        another line since: a loop that goes round moves; a call that never returns (a sleep, a
        lock, a collective) does not, nor a loop that only calls the same thing again (a
        DataLoader polling a dead worker). Frames are not held between looks (their locals
        would stay alive): their ids and code are."""
        frame = sys._current_frames().get(self._main)
        seen: dict[int, tuple[object, int]] = {}
        while frame is not None:
            seen[id(frame)] = (frame.f_code, frame.f_lineno)
            frame = frame.f_back
        before, self._seen = self._seen, seen
        return any(key in before and before[key][0] is code and before[key][1] != line
                   for key, (code, line) in seen.items())


def keep_vitals(path: str, phases_path: str | None = None) -> Vitals:
    """Started in a rank before its script runs: the step hook goes in as soon as torch.optim is
    imported; with `phases_path`, the step clock's hooks too (instrument.py), their windows
    written there."""
    vitals = Vitals(path, phases_path)
    after_import({"torch.optim.optimizer":
                  lambda module: module.register_optimizer_step_post_hook(vitals.step)})
    if phases_path:
        import atexit

        from ddptui.rank.telemetry.script_watch import watch_everything

        watch = watch_everything(int(os.environ.get("RANK", 0)), vitals.hold_phases)
        atexit.register(lambda: (watch.flush(), vitals.write_phases()))  # its last window
    vitals.start()
    return vitals
