"""The training loop of one rank, top to bottom: epochs, cut into segments by world and settings
changes; one step with no host/device sync; commands agreed at the same step on every rank;
validation and the epoch's end; recovery when a peer dies.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddptui.contract.protocol import events
from ddptui.contract.protocol.orders import Order, WorldOrder
from ddptui.contract.wording import count, epoch_line
from ddptui.rank.elastic.snapshot import WorldLost
from ddptui_trainer import member
from ddptui_trainer.checkpoint import save
from ddptui_trainer.parts import Parts
from ddptui_trainer.reports import report_bad, report_change, report_kept, report_segment

VAL_AHEAD = 50  # steps before the epoch's end at which the validation workers start loading


def on_urgent(order: Order, p: Parts) -> None:
    """On the mailbox thread, as soon as the supervisor says a peer died."""
    if p.snapshots is not None:
        p.snapshots.lost_if_recovering(order)


def run_epochs(p: Parts) -> bool:
    """Epochs until done (True), stopped or left (False); world changes happen in between."""
    while p.sampler.epoch < p.config.train.epochs:
        order = None
        try:
            if p.snapshots is not None and p.mailbox.has_urgent:
                # A peer died as this rank entered the world (a joiner settling): no step on
                # the broken world, whose NCCL collectives nothing would abort now.
                raise WorldLost("a peer died")
            outcome = run_segment(p)
        except Exception as e:
            p.state.changed_at = time.time()
            order = await_recover(p, e)
        if order is not None:
            # Out of the except block: the error's traceback held the broken world's sockets
            # open, and a peer still blocked on them would never see this rank leave.
            epoch, old_world = p.sampler.epoch, p.me.world_size
            redone = recover(p, order)
            report_kept(p, epoch, old_world, redone)
            p.me.say(f"recovered on {count(p.me.world_size, 'rank')}: back to global step "
                     f"{p.state.global_step}, {redone} steps to redo",
                     kind=events.Rollback, redone=redone, global_step=p.state.global_step)
            if order.stop:  # a stop that could not wait for a stalled rank
                p.orders.stop = True
            continue
        if outcome != "next":
            return False
    return True


def recover(p: Parts, order: WorldOrder) -> int:
    """world.recover, again from the next order while members die during it."""
    while True:
        try:
            return member.recover(p, order)
        except Exception as e:
            order = await_recover(p, e)


def await_recover(p: Parts, error: Exception) -> dict:
    """A collective failed: if a peer died, the supervisor's recover order arrives; otherwise
    (or without a supervisor) the error is ours and is raised again."""
    order = p.mailbox.recover_order(error) if p.snapshots is not None else None
    if order is None:
        raise error
    return order


def run_segment(p: Parts) -> str:
    """Train from the current position until the epoch ends or something changes the world
    or the settings: 'next' (carry on), 'stopped' or 'left'."""
    epoch = p.sampler.epoch
    p.meter.reset_epoch()
    p.state.segment_start = p.sampler.steps_done
    p.state.segment_global = p.state.global_step
    if p.snapshots is not None and p.sampler.steps_done == 0:
        p.snapshots.take(p.state.global_step, member.host_state(p))
    train_one_epoch(p, epoch)
    if p.orders.stop:
        if p.sampler.steps_done > p.state.segment_start:  # the partial epoch keeps its row
            report_segment(p, epoch, partial=True, at_quit=True)
        save(p)
        p.me.say(f"stopped at epoch {epoch} step {p.sampler.steps_done}")
        return "stopped"
    order, p.orders.reform = p.orders.reform, None
    if len(p.sampler) == 0:  # the epoch is done: a change asked for now lands at its boundary
        p.orders.apply_now = False
        end_epoch(p, epoch)
    elif p.orders.apply_now or order:
        report_segment(p, epoch, partial=True)
        if p.orders.apply_now:
            p.orders.apply_now = False
            apply_pending(p, epoch, step=p.sampler.steps_done)
    if order:
        p.state.changed_at = time.time()
        if not member.reform(p, order):
            p.me.announce("stopped",
                          reason=f"left the world at global step {p.state.global_step}")
            return "left"
    return "next"


def train_one_epoch(p: Parts, epoch: int) -> None:
    """The hot loop: no host/device sync, no I/O; the meter and control are lagged and cheap."""
    p.ddp.train()
    every, snap_every = p.config.checkpoint.every, p.config.checkpoint.snapshot_every
    pulse = p.me.pulse  # where the loop is, for the heartbeat: plain attribute writes
    clock = p.clock  # the step's phases; DDP's hooks mark forward, backward and comm
    clock.epoch = epoch
    clock.restart()  # validation, a checkpoint, a world change: no step's time
    # Closed on the way out, not when an exception's traceback lets go of it: a prefetching
    # thread must be gone before the loader is iterated again.
    with contextlib.closing(p.loaders.train_batches(p.state.settings["prefetch"],
                                                    clock.begin)) as batches:
        while True:
            while p.orders.paused and not p.orders.interrupted:
                pulse.phase = "paused"
                p.orders.carry_out(p.control.tick_paused())
                clock.restart()
            if p.orders.interrupted:
                break
            pulse.phase = "input"
            clock.begin("data")
            waited = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            p.meter.waited(time.perf_counter() - waited)
            pulse.phase = "compute"
            loss = train_step(p, images, labels)
            p.sampler.step_done()
            if len(p.sampler) <= VAL_AHEAD:
                p.loaders.arm_val()
            p.state.global_step += 1
            step = pulse.step = p.state.global_step
            if p.meter.step(loss, epoch, p.sampler.steps_done, step):
                report_bad(p)
            if p.snapshots is not None:
                if p.mailbox.has_urgent:
                    raise WorldLost("a peer died")
                p.snapshots.step_done(step)
            if p.state.changed_at is not None:
                report_change(p)
            if every and step % every == 0:
                pulse.phase = "checkpoint"
                save(p)
            pulse.phase = "control"
            p.orders.carry_out(p.control.poll())
            if p.snapshots is not None and step % snap_every == 0:
                p.snapshots.take(step, member.host_state(p))


def train_step(p: Parts, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Forward, backward, update; a rollback point still being copied out is waited for on the
    device, just before the tensors it reads are written."""
    if p.snapshots is not None:
        p.snapshots.before_forward()
    with p.autocast():
        loss = F.cross_entropy(p.ddp(images), labels)
    p.optimizer.zero_grad(set_to_none=True)
    p.scaler.scale(loss).backward()
    p.clock.begin("optimizer")
    if p.snapshots is not None:
        p.snapshots.before_update()
    p.scaler.step(p.optimizer)
    p.scaler.update()
    p.scheduler.step()
    p.clock.step_end()
    return loss


@torch.no_grad()
def validate(p: Parts) -> tuple[float, float, int] | None:
    """Loss, accuracy and sample count over the whole validation set, all-reduced (each sample
    once)."""
    if p.loaders.val is None:
        return None
    p.model.eval()  # the unwrapped module: no DDP collectives inside an uneven shard
    totals = torch.zeros(3, device=p.me.device, dtype=torch.float64)
    tuned = p.me.device.type == "cuda" and torch.backends.cudnn.benchmark
    for images, labels in p.loaders.val_batches():
        with p.autocast():
            logits = p.model(padded(images, p.config.train.batch_size) if tuned else images)
        logits = logits[:len(labels)]
        totals[0] += F.cross_entropy(logits.float(), labels, reduction="sum")
        totals[1] += (logits.argmax(1) == labels).sum()
        totals[2] += labels.numel()
    p.model.train()
    dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    return (loss_sum / count, correct / count, int(count)) if count else None


def padded(images: torch.Tensor, size: int) -> torch.Tensor:
    """A smaller last batch grown with zeros to the training batch's size, so its shapes are
    ones cuDNN has tuned for already: a new shape meant a benchmark of every convolution in the
    middle of the first epoch end. In eval mode each sample's output is its own."""
    n = len(images)
    if n >= size:
        return images
    layout = torch.channels_last if images.dim() == 4 and \
        images.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    out = torch.empty((size, *images.shape[1:]), dtype=images.dtype, device=images.device,
                      memory_format=layout)
    out[:n] = images
    out[n:] = 0
    return out


def end_epoch(p: Parts, epoch: int) -> None:
    p.clock.flush()  # a window ends with its epoch: memory is told epoch by epoch
    p.me.pulse.phase = "validate"
    val = validate(p)
    extra = {}
    if val:
        extra = {"val_loss": round(val[0], 5), "val_acc": round(val[1], 5), "val_samples": val[2]}
        p.state.best_val_acc = max(p.state.best_val_acc, val[1])
    ev = report_segment(p, epoch, **extra)
    if p.me.echo and p.me.is_main:
        print(epoch_line(ev), flush=True)
    p.sampler.set_epoch(epoch + 1)
    if epoch + 1 < p.config.train.epochs:
        apply_pending(p, epoch + 1)
    save(p)


def apply_pending(p: Parts, epoch: int, step: int = 0) -> None:
    """Settings agreed during the epoch take effect on every rank from the next epoch, or
    from an agreed step when `a` asked for them now."""
    if not p.state.pending:
        return
    p.state.settings.update(p.state.pending)
    p.state.pending.clear()
    torch.backends.cudnn.benchmark = p.state.settings["cudnn_benchmark"]
    p.loaders.apply(p.state.settings)
    if p.me.is_main:
        p.me.reporter.emit(events.Settings(rank=p.me.reporter.rank,
                                           settings=dict(p.state.settings), epoch=epoch, step=step,
                           status="applied"))
