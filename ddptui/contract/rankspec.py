"""What the supervisor hands a rank of the built-in loop it starts, and the rank's entry point,
which imports the loop by name inside the rank: the dashboard never imports the trainer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddptui.contract.options.config import RunConfig

BUILTIN_RANK = "ddptui_trainer.bootstrap"


@dataclass(frozen=True)
class RankSpec:
    """Who one rank of the built-in loop is and where it runs: what the supervisor tells a rank
    process it starts, or what torchrun's (or srun's) environment says (no supervisor fields)."""

    config: RunConfig
    slot: int  # the rank's name for the whole run
    rank: int  # its rank in the world it starts in (a standby's is assigned when it joins)
    world_size: int
    init_method: str = "env://"
    physical_gpu: int | None = None  # the supervisor's choice; else found from local_rank
    local_rank: int | None = None  # under torchrun: its cuda:N (None: the rank)
    echo: bool = False  # print progress to the console (rank 0 under torchrun)
    parent_pid: int | None = None  # the supervisor's, which the rank dies with
    output_path: str | None = None  # the rank's stdout/stderr: tracebacks land here, not on the dashboard
    stacks_path: str | None = None  # where SIGUSR1 makes faulthandler write every thread's Python stack
    standby: bool = False  # warm up, then wait for the supervisor's join order
    environ: dict[str, str] | None = None  # the supervisor's, as the rank is started


def run_builtin_rank(spec: RankSpec, channel, inbox) -> None:
    """multiprocessing's target for a rank of the built-in loop."""
    importlib.import_module(BUILTIN_RANK).run_rank(spec, channel, inbox)
