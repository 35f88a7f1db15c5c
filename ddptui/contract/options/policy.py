"""What ddptui does around the ranks of a built-in run, beside the ranks' own RunConfig: how a
crash or a stall is handled and whether settings are tried out. The ranks never see it."""

from __future__ import annotations

from dataclasses import dataclass

from ddptui.contract.options.argtypes import non_negative_int, positive_float
from ddptui.contract.options.parser import option


@dataclass(frozen=True)
class RunPolicy:
    """`ddptui run MODEL`'s own options, declared with their flags (ddptui/contract/options/parser.py)."""

    GROUP = "launch"
    autotune: bool = option(
        False, "early in epoch 0, try DataLoader worker counts (and the prefetcher on GPUs) for "
        "a few seconds each and keep the fastest", action="store_true")
    max_restarts: int = option(
        0, "bring crashed ranks back into the run, K times in all (default 0: the run goes on "
        "without them; r brings one back)", type=non_negative_int, metavar="K")
    stall_after: float | None = option(
        None, "a rank that finishes no step for S seconds is flagged stalled (default: max(10, "
        "20 x its median step time); 60 s for a first step)", group="health",
        type=positive_float, metavar="S")
    on_stall: str = option(
        "warn", "warn: flag it and show where it is stuck (k kills it); recover: kill it and go "
        "on through crash recovery", group="health", choices=("warn", "recover"))
