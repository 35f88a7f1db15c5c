"""The epochs table of a recorded run as CSV (`ddptui replay LOG --csv`), one row per epoch or
part of one, as the dashboard shows them, for a spreadsheet or a notebook.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from typing import TextIO

from ddptui.dashboard.sources.replay import Replay

COLUMNS = ("restart", "epoch", "at_step", "start_step", "end_step", "partial", "seconds",
           "samples_per_s", "steps_per_s", "data_wait", "train_loss", "val_loss", "val_acc",
           "bad_samples", "world_size", "ranks", "rolled_back", "at_quit")
SETTINGS = ("prefetch", "workers", "cudnn_benchmark")


def write_epochs_csv(log_path: str, out: TextIO, warn: Callable[[str], None]) -> int:
    """Play the log through (no waiting) and write its epochs table; returns the rows written.
    A script's own figures (--metric, run.log) are columns after ddptui's; lines of the log
    that are not events are skipped, and `warn` says which."""
    replay = Replay(log_path, speed=0)
    replay.start()
    replay.done.wait()
    if replay.bad_lines:
        warn(replay.skipped())
    rows = replay.state.view().epochs
    figures = sorted({name for e in rows for name in e["metrics"]})
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*COLUMNS, *SETTINGS, *figures])
    for e in rows:
        writer.writerow([_cell(e.get(c)) for c in COLUMNS]
                        + [_cell(e["settings"].get(s)) for s in SETTINGS]
                        + [_cell(e["metrics"].get(f)) for f in figures])
    return len(rows)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
