"""Who a rank process is in the job: its slot, its rank in the current world, its device, and
where its events and messages go.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch

from ddptui.contract.protocol import events
from ddptui.rank.telemetry.heartbeat import Pulse
from ddptui.rank.telemetry.reporter import Reporter


@dataclass
class Rank:
    """Who this process is in the job and what it computes on."""

    slot: int  # the rank's name for the run (telemetry, keys); fixed while `rank` may change
    rank: int  # its rank in the current world
    world_size: int
    device: torch.device
    physical_gpu: int | None
    reporter: Reporter
    echo: bool  # print progress to the console (rank 0 under torchrun)
    standby: bool = False  # started to join a running world later
    pulse: Pulse = field(default_factory=Pulse)  # where the loop is, for the heartbeat

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def announce(self, state: str, **fields) -> None:
        """A `rank` event about this process: where it runs and what state it is in."""
        # The physical GPU by its nvidia-smi index: the rank sees it as cuda:0.
        device = f"GPU {self.physical_gpu}" if self.device.type == "cuda" and \
            self.physical_gpu is not None else str(self.device)
        self.reporter.emit(events.Rank(rank=self.reporter.rank, state=state, pid=os.getpid(), device=device,
                           gpu=self.physical_gpu, host=os.uname().nodename, **fields))

    def say(self, text: str, level: str = "info", kind: type[events.Notice] = events.Notice,
            **fields) -> None:
        """Progress for the user: rank 0 reports it; warnings come from every rank. `kind`: a
        line that tells more, with its `fields` (the data's facts, a corrupt sample)."""
        if self.is_main or level != "info":
            self.reporter.emit(kind(rank=self.reporter.rank, level=level, text=text, **fields))
            if self.echo:
                print(text if level == "info" else f"rank {self.rank}: {level}: {text}",
                      file=sys.stdout if level == "info" else sys.stderr, flush=True)
