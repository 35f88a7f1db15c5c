"""What a rank's loop carries from step to step (State), and the built pieces the loop and the
world changes work with (Parts), passed as one object.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ddptui.contract.options.config import RunConfig
from ddptui.rank.elastic.agreed import AgreedOrders
from ddptui.rank.elastic.control import Control, Mailbox
from ddptui.rank.elastic.snapshot import Snapshots
from ddptui.rank.sampler import ShardedBatchSampler
from ddptui.rank.telemetry.phases import StepClock
from ddptui.rank.telemetry.reporter import StepMeter
from ddptui_trainer.checkpoint import Writer
from ddptui_trainer.pipeline.loaders import Loaders
from ddptui_trainer.rank import Rank


@dataclass
class State:
    """What the loop carries from step to step and into a checkpoint."""

    settings: dict
    global_step: int = 0
    best_val_acc: float = 0.0
    segment_start: int = 0  # the epoch's step where the current measured segment began
    segment_global: int = 0  # the global step it began at
    changed_at: float | None = None  # when the world last started to change, until a step ends
    change_marks: list = field(default_factory=list)  # (phase, end time) of that change
    pending: dict = field(default_factory=dict)  # settings waiting for the epoch boundary

    def mark(self, phase: str) -> None:
        """A phase of the current world change ended: the first step after it says what each
        phase cost."""
        if self.changed_at is not None:
            self.change_marks.append((phase, time.time()))


@dataclass
class Parts:
    """The built pieces the loop works with, passed as one object."""

    config: RunConfig
    me: Rank
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    sampler: ShardedBatchSampler
    loaders: Loaders
    meter: StepMeter
    autocast: object
    state: State
    ddp: torch.nn.Module | None = None  # DDP (DataParallel with --strategy dp); None out of a world
    control: Control | None = None  # commands agreed in the current world
    mailbox: Mailbox | None = None  # the supervisor's (or attach's) orders
    orders: AgreedOrders | None = None  # what the agreed ones asked (paused, stop, a change)
    snapshots: Snapshots | None = None  # rollback points (crash recovery under ddptui run)
    checkpoints: Writer | None = None  # rank 0's, when a checkpoint directory is set
    clock: StepClock | None = None  # the phases of each step (ddptui/rank/telemetry/phases.py)
