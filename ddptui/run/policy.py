"""What ddptui does around the ranks of a built-in run, beside the ranks' own RunConfig: how a
crash or a stall is handled and whether settings are tried out. The ranks never see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunPolicy:
    max_restarts: int = 0  # crashed ranks brought back, in all
    autotune: bool = False  # try worker counts and the prefetcher early in epoch 0
    stall_after: float | None = None  # None: max(10 s, 20 x the rank's median step)
    on_stall: str = "warn"  # recover: kill a stalled rank, crash recovery follows
