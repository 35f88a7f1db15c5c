"""The built-in loop as a member of a changing world (ddptui/rank/elastic/change.py, which a
run.elastic() script shares): its state for a joiner, its rollback, what follows a new world.
"""

from __future__ import annotations

import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptui.contract.protocol import events
from ddptui.contract.protocol.orders import Join, Order, WorldOrder
from ddptui.rank.elastic import change
from ddptui.rank.elastic.control import Control
from ddptui.rank.elastic.snapshot import state_tensors
from ddptui.rank.telemetry.instrument import watch_ddp
from ddptui.rank.telemetry.phases import NoClock, StepClock
from ddptui_trainer.parts import Parts
from ddptui_trainer.rank import Rank


def reform(p: Parts, order: WorldOrder) -> bool:
    """Apply an agreed leave or join; False when this rank is the one leaving."""
    p.me.pulse.phase = "world"
    leftover = p.control.finish()
    p.state.mark("agree")
    p.ddp = p.control = None
    return change.reform(LoopMember(p), order, leftover)


def join(p: Parts) -> bool:
    """A standby waits for its join order, enters the world and takes a live rank's state (a
    member's death after that is recovered from before the first step: run_epochs)."""
    p.me.pulse.phase = "world"
    order = p.mailbox.wait_urgent(None)
    if not isinstance(order, Join):
        return False
    p.state.changed_at = time.time()
    change.join(LoopMember(p), order)
    return True


def recover(p: Parts, order: WorldOrder) -> int:
    """After a peer died: re-form from the survivors and roll back to the newest point they all
    hold and know to be good; returns the number of steps that will be redone."""
    p.me.pulse.phase = "world"
    p.ddp = p.control = p.orders.reform = None  # a change agreed before the death is void
    return change.recover(LoopMember(p), order)


def wrap(model: torch.nn.Module, me: Rank, strategy: str = "ddp",
         in_sync: bool = False, clock: StepClock | None = None) -> torch.nn.Module:
    """DDP over the current world (its construction checks the shapes and broadcasts rank 0's
    parameters, unless every member is known to hold the same state already), or DataParallel
    over this process's GPUs for --strategy dp."""
    if strategy == "dp" and me.device.type == "cuda":
        return torch.nn.DataParallel(model, device_ids=list(range(torch.cuda.device_count())))
    ddp = DDP(model, device_ids=[me.device.index] if me.device.type == "cuda" else None,
              gradient_as_bucket_view=True, init_sync=not in_sync)
    if clock is not None and not isinstance(clock, NoClock):  # forward, backward, all-reduce
        watch_ddp(ddp, clock)
    return ddp


def host_state(p: Parts) -> dict:
    """The training state that lives on the host (the rest is in state_tensors)."""
    return {"global_step": p.state.global_step, "sampler": p.sampler.state_dict(),
            "scheduler": p.scheduler.state_dict(),
            "lrs": [(g["lr"], g["initial_lr"]) for g in p.optimizer.param_groups]}


def load_host_state(p: Parts, host: dict) -> None:
    p.state.global_step = host["global_step"]
    p.sampler.load_state_dict(host["sampler"])
    p.scheduler.load_state_dict(host["scheduler"])
    for g, (lr, initial) in zip(p.optimizer.param_groups, host["lrs"], strict=True):
        g["lr"], g["initial_lr"] = lr, initial


class LoopMember:
    """change.Member for the built-in loop's Parts, for one change of its world."""

    eager = True

    def __init__(self, p: Parts):
        self.p = p
        self.mailbox, self.slot, self.device = p.mailbox, p.me.slot, p.me.device
        self.lr_world = p.me.world_size  # the world size the lr is scaled for

    # Its place in the world is the Rank's, which the rest of the loop reads.
    rank = property(lambda self: self.p.me.rank, lambda self, v: setattr(self.p.me, "rank", v))
    world_size = property(lambda self: self.p.me.world_size,
                          lambda self, v: setattr(self.p.me, "world_size", v))

    def mark(self, phase: str) -> None:
        self.p.state.mark(phase)

    def warn(self, text: str) -> None:
        self.p.me.say(text, "warning")

    def state_for_joiner(self) -> tuple[dict, list[torch.Tensor]]:
        p = self.p
        host = {**host_state(p), "world_size": p.me.world_size, "paused": p.orders.paused,
                "settings": dict(p.state.settings), "pending": dict(p.state.pending),
                "best_val_acc": p.state.best_val_acc}
        return host, state_tensors(p.model, p.optimizer, p.scaler)

    def tensors_to_receive(self, specs: list[tuple]) -> list[torch.Tensor]:
        """Its own: a standby built the same model and optimizer state."""
        p = self.p
        if p.snapshots is not None:  # a rollback point still being copied out reads these
            p.snapshots.before_update()
        own = state_tensors(p.model, p.optimizer, p.scaler)
        if [(t.shape, t.dtype) for t in own] != [(shape, dtype) for shape, dtype, _ in specs]:
            raise RuntimeError("the joiner's training state differs from the members'")
        return own

    def load_from_member(self, host: dict, tensors: list[torch.Tensor]) -> None:
        p = self.p
        load_host_state(p, host)
        self.lr_world = host["world_size"]
        p.orders.paused, p.state.best_val_acc = host["paused"], host["best_val_acc"]
        p.state.settings.update(host["settings"])
        p.state.pending = dict(host["pending"])
        torch.backends.cudnn.benchmark = p.state.settings["cudnn_benchmark"]
        p.loaders.apply(p.state.settings)

    def rollback_summary(self) -> dict:
        return self.p.snapshots.summary()

    def roll_back(self, target: int) -> int:
        redone = self.p.state.global_step - target
        load_host_state(self.p, self.p.snapshots.restore(target))
        return redone

    def settle(self, group, order: WorldOrder, leftover: list[Order]) -> None:
        """Shards, lr, DDP, control, a fresh rollback point."""
        p = self.p
        p.sampler.set_world(p.me.rank, p.me.world_size)
        if p.config.train.lr_scaling == "linear" and self.lr_world != p.me.world_size:
            rescale_lr(p, p.me.world_size / self.lr_world)
        # Members that stayed hold the same state, a joiner has just been sent it, and a
        # recovery restored a common point: DDP's own check and broadcast would be a second
        # round trip.
        p.ddp = wrap(p.model, p.me, p.config.devices.strategy, in_sync=True, clock=p.clock)
        p.state.mark("ddp")
        p.control = Control(p.mailbox, p.me.rank, group)
        p.loaders.reshard()
        p.state.mark("loaders")
        p.me.announce("running", world_rank=p.me.rank)
        if p.me.is_main:
            p.mailbox.requeue(leftover)
            p.me.reporter.emit(events.World(
                rank=p.me.reporter.rank, size=p.me.world_size, ranks=order.members,
                generation=order.gen, epoch=p.sampler.epoch, step=p.sampler.steps_done,
                global_step=p.state.global_step, base_lr=p.scheduler.base_lrs[0]))
        if p.snapshots is not None:
            p.snapshots.take(p.state.global_step, host_state(p), agreed=True)
        p.state.mark("settle")


def rescale_lr(p: Parts, factor: float) -> None:
    """--lr-scaling linear: the lr follows the world size."""
    for g in p.optimizer.param_groups:
        g["lr"] *= factor
        g["initial_lr"] *= factor
    p.scheduler.base_lrs = [lr * factor for lr in p.scheduler.base_lrs]
