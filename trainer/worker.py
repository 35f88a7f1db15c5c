"""One DDP rank: process group, data, model, and the training loop that applies live commands.

`main()` is the entry for ranks spawned by ddptui's supervisor and, through __main__.py, for
ranks started by torchrun or srun. Everything is built by plain functions from one RunConfig.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer import world
from trainer.checkpoint import find_resume_state, load_checkpoint, prune_checkpoints, save_checkpoint
from trainer.config import DataError, RunConfig, UsageError
from trainer.control import Control, Mailbox
from trainer.data import (
    build_datasets,
)
from trainer.gpu import DeviceSampler
from trainer.heartbeat import Heartbeat
from trainer.loaders import Loaders
from trainer.models import build_model, count_parameters
from trainer.parts import Parts, State
from trainer.prefetch import plain_batches
from trainer.protocol.channel import load_key, parse_address
from trainer.protocol.events import describe
from trainer.rank import Rank
from trainer.remote import RemoteLink, node_name
from trainer.reporter import Reporter, StepMeter
from trainer.sampler import ShardedBatchSampler
from trainer.snapshot import Snapshots, WorldLost, state_tensors
from trainer.tensorboard import TensorBoardSink

RECOVER_WAIT_S = 10.0  # after a collective failed: how long to wait for the supervisor's order


def main(config: RunConfig, rank: int, world_size: int, *, local_rank: int | None = None,
         init_method: str = "env://", channel=None, inbox=None, physical_gpu: int | None = None,
         echo: bool = False, slot: int | None = None, standby: bool = False,
         forming: world.Forming | None = None) -> int:
    """Train as one rank; return the process exit code (0 done, 1 failed, 2 bad input).

    A standby builds everything, warms up and waits for the supervisor to let it join.
    `forming`: the process group already being formed (on cuda:0 or the CPU)."""
    use_cuda = torch.cuda.is_available() and config.cpus is None
    local = rank if local_rank is None else local_rank
    device = torch.device("cuda", 0 if physical_gpu is not None else local) if use_cuda else \
        torch.device("cpu")
    if use_cuda and physical_gpu is None:
        physical_gpu = _physical_index(local)
    slot = rank if slot is None else slot
    me = Rank(slot, rank, world_size, device, physical_gpu if use_cuda else None,
              Reporter(slot, channel, config.log if channel is None else None), echo, standby)
    supervised = channel is not None
    if config.tensorboard:
        me.reporter.sinks.append(TensorBoardSink(config.tensorboard, slot))
    link = None
    if config.report and not supervised:
        link = RemoteLink(parse_address(config.report, "--report"), load_key()[0], node_name(),
                          lambda text: print(f"rank {rank}: {text}", file=sys.stderr, flush=True))
        me.reporter.sinks.append(link)
        inbox = link.inbox
    watchers = _watchers(config, me, supervised) if config.telemetry_hz > 0 else []
    code = 1
    try:
        control_group = None
        if not standby:
            if use_cuda:  # (a Forming thread set it on its own thread only)
                torch.cuda.set_device(device)
            control_group = forming.result() if forming is not None else \
                world.form(rank, world_size, device, init_method)
            if not supervised:
                inbox = _agree_on_control(me, inbox, control_group)
            me.announce("running")
            me.say(f"process group ready: {world_size} ranks on {dist.get_backend()}")
            if link is not None and me.is_main:
                me.reporter.emit("run", status="started", model=config.model, data=config.data,
                                 epochs=config.epochs, world_size=world_size,
                                 device_kind=device.type, batch_size=config.batch_size)
        for thread in watchers:
            thread.start()
        train(config, me, inbox, control_group, supervised)
        code = 0
    except (UsageError, DataError) as e:
        text = _one_line(e)
        me.reporter.emit("message", level="error", text=text, usage=True)
        if echo or channel is None:
            print(f"error: {text}", file=sys.stderr, flush=True)
        code = 2
    except Exception as e:
        traceback.print_exc()
        me.reporter.emit("message", level="error", text=f"{type(e).__name__}: {_one_line(e)}")
    finally:
        for thread in watchers:
            thread.stop()
        if dist.is_initialized():
            world.dismantle(lambda text: me.say(text, "warning"))
        if link is not None:  # no supervisor says how this rank ended: it says so itself
            me.announce("done" if code == 0 else "crashed", exit_code=code)
            if me.is_main:
                me.reporter.emit("run", status="done" if code == 0 else "failed", exit_code=code)
        me.reporter.close()
    return code


def _watchers(config: RunConfig, me: Rank, supervised: bool) -> list:
    """The rank's reporting threads: under ddptui run a heartbeat (the parent samples the GPUs);
    under torchrun or srun a device sampler per GPU it drives (DataParallel drives them all)."""
    if supervised:
        return [Heartbeat(me.pulse, me.reporter.emit)]
    gpus = list(config.gpus) if config.strategy == "dp" and me.device.type == "cuda" \
        else [me.physical_gpu]
    return [DeviceSampler(me.reporter.emit, lambda t: me.say(t, "warning"), g) for g in gpus]


def _agree_on_control(me: Rank, inbox, group):
    """Commands need every rank in the control exchange: with a dashboard link on some ranks
    only (an environment variable set on one node), control stays off everywhere."""
    flag = torch.tensor([int(inbox is not None)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    if inbox is not None and not flag.item():
        me.say("not every rank reports to the dashboard: live control is off", "warning")
        return None
    return inbox


def _one_line(e: Exception) -> str:
    # DataLoader re-raises a worker's exception with the worker traceback in the message.
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()] or [type(e).__name__]
    last = lines[-1]
    for prefix in ("trainer.config.DataError: ", "trainer.config.UsageError: "):
        last = last.removeprefix(prefix)
    return last


def _physical_index(local_rank: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v for v in visible.split(",") if v.strip()]
        if local_rank < len(ids) and ids[local_rank].strip().isdigit():
            return int(ids[local_rank])
    return local_rank


def configure_torch(config: RunConfig, me: Rank) -> None:
    torch.manual_seed(config.seed)
    if me.device.type == "cpu":
        # Ranks share the host's cores; oversubscribed intra-op threads thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // me.world_size))
    torch.backends.cudnn.benchmark = config.cudnn_benchmark
    if config.deterministic:
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
    if config.amp == "off" and me.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def build_optimizer(config: RunConfig, model: torch.nn.Module, world_size: int,
                    total_steps: int):
    lr = config.lr * (world_size if config.lr_scaling == "linear" else 1)
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]  # norms and biases
    optimizer = torch.optim.SGD(
        [{"params": decay, "weight_decay": config.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, momentum=config.momentum, nesterov=True)
    for p in model.parameters():
        # Made now rather than at the first step (zeros give the same first update), so the
        # state has one shape from the start: rollback points and joining ranks rely on it.
        optimizer.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    warmup = max(1, total_steps // 10)

    def factor(step: int) -> float:
        # Linear warm-up, then cosine decay; clamped, since a resumed or re-sharded run may
        # take more steps than planned.
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train(config: RunConfig, me: Rank, inbox, control_group, supervised: bool) -> None:
    """Build everything, enter the world (a standby waits to join), then run epochs."""
    if config.strategy == "dp" and me.device.type == "cuda":
        # DataParallel splits each batch across the GPUs: --batch-size stays per GPU.
        config = config.replace(batch_size=config.batch_size * torch.cuda.device_count())
    configure_torch(config, me)
    bundle = build_datasets(config, progress=me.say)
    with me.device:  # initialised where it trains: no CPU init and copy (1 s for resnet50)
        model = build_model(config.model, bundle.num_classes, bundle.in_channels,
                            config.resolved_image_size)
    model = model.to(me.device)  # a user's model may pin its own tensors elsewhere
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if config.sync_bn:
        if me.device.type == "cuda":
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:
            me.say("--sync-bn needs CUDA ranks; using per-rank BatchNorm", "warning")
    # Sized for the world the run started with: a joining rank takes its position (and the lr
    # that goes with the world it joins) from a live rank.
    sampler = ShardedBatchSampler(bundle.num_train, config.batch_size, me.rank, me.world_size,
                                  seed=config.seed, max_steps=config.steps_per_epoch)
    total_steps = config.epochs * len(sampler)
    if total_steps == 0:
        raise UsageError(f"{bundle.num_train} training samples make no step of "
                         f"{config.batch_size} x {me.world_size} ranks: lower --batch-size")
    optimizer, scheduler = build_optimizer(config, model, me.world_size, total_steps)
    scaler = torch.amp.GradScaler(me.device.type, enabled=config.amp == "fp16")
    scaler.scale(torch.zeros((), device=me.device))  # creates its state tensors now
    state = State(settings=config.settings(me.world_size))
    if not me.standby:
        resume(config, me, model, optimizer, scheduler, scaler, sampler, state)
    loaders = Loaders(config, me, bundle, sampler, state.settings)
    meter = StepMeter(me.reporter, config.telemetry_hz, config.batch_size, me.device,
                      sampler.progress)
    p = Parts(config=config, me=me, model=model, optimizer=optimizer, scheduler=scheduler,
              scaler=scaler, sampler=sampler, loaders=loaders, meter=meter,
              autocast=_autocast(config, me.device), state=state)
    if inbox is not None:  # live commands (ddptui run or attach)
        p.mailbox = Mailbox(inbox, lambda order: _on_urgent(order, p))
        if supervised and config.snapshot_every:  # recovery needs our supervisor's orders
            p.snapshots = Snapshots(state_tensors(model, optimizer, scaler),
                                    me.device.type == "cuda")
    try:
        if me.standby:
            warm_up(p)
            me.announce("standby")
            if not world.join(p):
                return
        else:
            p.ddp = world.wrap(model, me, config.strategy)
            p.control = Control(p.mailbox, me.rank, control_group)
            params, steps = count_parameters(model), total_steps // config.epochs
            me.say(f"{config.model}: {params / 1e6:.1f}M parameters, {bundle.num_classes} "
                   f"classes, {bundle.num_train} training samples, {steps} steps per epoch",
                   steps_per_epoch=steps, num_train=bundle.num_train,
                   num_classes=bundle.num_classes, params=params)
            if me.is_main:
                me.reporter.emit("settings", settings=dict(state.settings), epoch=sampler.epoch,
                                 status="applied")
            if me.device.type != "cuda" and state.settings["prefetch"] and config.decode != "gpu":
                me.say("prefetcher needs CUDA: CPU ranks load batches directly")
            if config.strategy == "dp":
                me.say("--strategy dp: cudnn.benchmark is off (DataParallel's per-step threads "
                       "would autotune again every step)")
            if me.device.type != "cuda" and config.decode == "gpu":
                me.say("--decode gpu on CPU ranks: JPEGs are decoded in the rank process")
        if run_epochs(p):
            me.say("training done")
    finally:
        if p.control is not None:
            p.control.finish()
        loaders.close()
        loaders.bad.close()


def _on_urgent(order: dict, p: Parts) -> None:
    """On the mailbox thread, as soon as the supervisor says a peer died."""
    if order.get("op") == "recover":
        if p.snapshots is not None:
            p.snapshots.mark_lost()
        if p.me.device.type == "cuda":
            world.abort(lambda text: p.me.say(text, "warning"))


def warm_up(p: Parts) -> None:
    """One forward and backward at the training shapes, so that cudnn has chosen its
    algorithms before the join instead of stalling the ranks it joins."""
    size, channels = p.config.resolved_image_size, p.loaders.bundle.in_channels
    images = torch.zeros(p.config.batch_size, channels, size, size, device=p.me.device)
    if p.config.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.zeros(p.config.batch_size, dtype=torch.long, device=p.me.device)
    with p.autocast():
        loss = F.cross_entropy(p.model(images), labels)
    p.scaler.scale(loss).backward()
    p.optimizer.zero_grad(set_to_none=True)
    p.loaders.start_workers()
    if p.me.device.type == "cuda":
        torch.cuda.synchronize(p.me.device)


def run_epochs(p: Parts) -> bool:
    """Epochs until done (True), stopped or left (False); world changes happen in between."""
    while p.sampler.epoch < p.config.epochs:
        order = None
        try:
            outcome = run_segment(p)
        except Exception as e:
            p.state.changed_at = time.time()
            order = await_recover(p, e)
        if order is not None:
            # Out of the except block: the error's traceback held the broken world's sockets
            # open, and a peer still blocked on them would never see this rank leave.
            epoch, old_world = p.sampler.epoch, p.me.world_size
            redone = world.recover(p, order)
            report_kept(p, epoch, old_world, redone)
            p.me.say(f"recovered on {_count(p.me.world_size, 'rank')}: back to global step "
                     f"{p.state.global_step}, {redone} steps to redo",
                     redone=redone, global_step=p.state.global_step)
            if order.get("stop"):  # a stop that could not wait for a stalled rank
                p.state.stop = True
            continue
        if outcome != "next":
            return False
    return True


def await_recover(p: Parts, error: Exception) -> dict:
    """A collective failed: if a peer died, the supervisor's recover order arrives; otherwise
    (or without a supervisor) the error is ours and is raised again."""
    # Collective failures (DistError, WorldLost) are RuntimeErrors; an OOM is this rank's own.
    if p.snapshots is None or isinstance(error, torch.OutOfMemoryError) or \
            not (isinstance(error, RuntimeError) or p.mailbox.has_urgent):
        raise error
    order = p.mailbox.wait_urgent(RECOVER_WAIT_S)
    if order is None or order.get("op") != "recover":
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
        p.snapshots.take(p.state.global_step, world.host_state(p))
    train_one_epoch(p, epoch)
    if p.state.stop:
        if p.sampler.steps_done > p.state.segment_start:  # the partial epoch keeps its row
            report_segment(p, epoch, partial=True, at_quit=True)
        save(p)
        p.me.say(f"stopped at epoch {epoch} step {p.sampler.steps_done}")
        return "stopped"
    order, p.state.reform = p.state.reform, None
    if len(p.sampler) == 0:  # the epoch is done: a change asked for now lands at its boundary
        p.state.apply_now = False
        end_epoch(p, epoch)
    elif p.state.apply_now or order:
        report_segment(p, epoch, partial=True)
        if p.state.apply_now:
            p.state.apply_now = False
            apply_pending(p, epoch, step=p.sampler.steps_done)
    if order:
        p.state.changed_at = time.time()
        if not world.reform(p, order):
            p.me.announce("stopped",
                          reason=f"left the world at global step {p.state.global_step}")
            return "left"
    return "next"


def _autocast(config: RunConfig, device: torch.device):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.amp)
    return lambda: torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def train_one_epoch(p: Parts, epoch: int) -> None:
    """The hot loop: no host/device sync, no I/O; the meter and control are lagged and cheap."""
    p.ddp.train()
    every, snap_every = p.config.checkpoint_every, p.config.snapshot_every
    pulse = p.me.pulse  # where the loop is, for the heartbeat: plain attribute writes
    # Closed on the way out, not when an exception's traceback lets go of it: a prefetching
    # thread must be gone before the loader is iterated again.
    with contextlib.closing(p.loaders.train_batches(p.state.settings["prefetch"])) as batches:
        while True:
            while p.state.paused and not _interrupted(p.state):
                pulse.phase = "paused"
                handle_commands(p, p.control.tick_paused())
            if _interrupted(p.state):
                break
            pulse.phase = "input"
            waited = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                break
            p.meter.waited(time.perf_counter() - waited)
            pulse.phase = "compute"
            with p.autocast():
                loss = F.cross_entropy(p.ddp(images), labels)
            p.optimizer.zero_grad(set_to_none=True)
            p.scaler.scale(loss).backward()
            p.scaler.step(p.optimizer)
            p.scaler.update()
            p.scheduler.step()
            p.sampler.step_done()
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
            handle_commands(p, p.control.poll())
            if p.snapshots is not None and step % snap_every == 0:
                p.snapshots.take(step, world.host_state(p))


def report_bad(p: Parts) -> None:
    """Name each corrupt sample the loader skipped, once; without a supervisor to count them
    over every rank, end the run past --max-bad-samples."""
    bad = p.loaders.bad
    for path, why in bad.read():
        p.me.say(f"skipped corrupt sample {path}: {why} ({len(bad.seen)} on this rank, "
                 f"at most {bad.limit})", "warning", bad_sample=len(bad.seen), path=path,
                 limit=bad.limit)
        if not p.me.reporter.channel and len(bad.seen) > bad.limit:
            raise DataError(f"{len(bad.seen)} corrupt samples, more than --max-bad-samples "
                            f"{bad.limit}; the last: {path}")


def report_change(p: Parts) -> None:
    """How long the world change cost this rank, up to the end of its first step in the new
    world (one device sync, once per change, to time the step for real)."""
    if p.me.device.type == "cuda":
        torch.cuda.synchronize(p.me.device)
    seconds = time.time() - p.state.changed_at
    p.state.changed_at = None
    p.me.reporter.emit("message", level="info", change_s=round(seconds, 3),
                       world_size=p.me.world_size, global_step=p.state.global_step,
                       text=f"first step on {_count(p.me.world_size, 'rank')} {seconds:.2f} s after the "
                       "world changed")


def _interrupted(state: State) -> bool:
    return state.stop or state.apply_now or state.reform is not None


def handle_commands(p: Parts, commands: list[dict]) -> None:
    """Apply agreed commands; every rank runs this with the same list at the same step."""
    for cmd in commands:
        op = cmd.get("op")
        if op == "pause" and not p.state.paused:
            p.state.paused = True
            p.me.reporter.emit("run", status="paused", global_step=p.state.global_step)
        elif op == "resume" and p.state.paused:
            p.state.paused = False
            p.me.reporter.emit("run", status="resumed", global_step=p.state.global_step)
        elif op == "checkpoint":
            save(p)
        elif op == "stop":
            p.state.stop = True
        elif op == "apply" and p.state.pending:
            p.state.apply_now = True
        elif op == "reform":
            p.state.reform = cmd
        elif op == "settings":
            p.state.pending.update(cmd["settings"])
            if p.me.is_main:
                p.me.reporter.emit("settings", settings={**p.state.settings, **p.state.pending},
                                   epoch=p.sampler.epoch + 1, status="pending")


@torch.no_grad()
def validate(p: Parts) -> tuple[float, float] | None:
    """Loss and accuracy over the whole validation set, all-reduced (each sample once)."""
    if p.loaders.val is None:
        return None
    p.model.eval()  # the unwrapped module: no DDP collectives inside an uneven shard
    totals = torch.zeros(3, device=p.me.device, dtype=torch.float64)
    for images, labels in plain_batches(p.loaders.val, p.loaders.prepare):
        with p.autocast():
            logits = p.model(images)
        totals[0] += F.cross_entropy(logits.float(), labels, reduction="sum")
        totals[1] += (logits.argmax(1) == labels).sum()
        totals[2] += labels.numel()
    p.model.train()
    dist.all_reduce(totals)
    loss_sum, correct, count = totals.tolist()
    return (loss_sum / count, correct / count) if count else None


def report_segment(p: Parts, epoch: int, partial: bool = False, world_size: int | None = None,
                   **extra) -> dict:
    """The `epoch` event for the steps since the segment began (a whole epoch, or the part of
    it before a settings or world change), so rows show img/s before and after a change."""
    ev = dict(epoch=epoch, start_step=p.state.segment_start, end_step=p.sampler.steps_done,
              partial=partial, settings=dict(p.state.settings),
              world_size=world_size or p.me.world_size, global_step=p.state.global_step,
              bad_samples=p.loaders.bad_in(epoch), **p.meter.epoch_summary())
    ev.update(extra)
    p.me.reporter.emit("epoch", **ev)
    return ev


def report_kept(p: Parts, epoch: int, old_world: int, redone: int) -> None:
    """After a rollback: the row for what the old world trained up to the point it went back
    to (the steps after it are trained again and counted in the next row)."""
    kept = p.state.global_step - p.state.segment_global
    if p.sampler.epoch != epoch or kept <= 0:
        return
    batch = p.config.batch_size * old_world
    report_segment(p, epoch, partial=True, world_size=old_world, rolled_back=redone,
                   steps=kept, samples=kept * batch)


def end_epoch(p: Parts, epoch: int) -> None:
    p.me.pulse.phase = "validate"
    val = validate(p)
    extra = {}
    if val:
        extra = {"val_loss": round(val[0], 5), "val_acc": round(val[1], 5)}
        p.state.best_val_acc = max(p.state.best_val_acc, val[1])
    ev = report_segment(p, epoch, **extra)
    if p.me.echo and p.me.is_main:
        print(describe({"kind": "epoch", "rank": 0, **ev}), flush=True)
    p.sampler.set_epoch(epoch + 1)
    if epoch + 1 < p.config.epochs:
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
        p.me.reporter.emit("settings", settings=dict(p.state.settings), epoch=epoch, step=step,
                           status="applied")


def save(p: Parts) -> None:
    """Rank 0 writes a checkpoint of the current position (when a directory is set)."""
    if not p.config.checkpoint_dir or not p.me.is_main:
        return
    path = save_checkpoint(p.config.checkpoint_dir, {
        "model_name": p.config.model,
        "model": p.model.state_dict(),
        "optimizer": p.optimizer.state_dict(),
        "scheduler": p.scheduler.state_dict(),
        "scaler": p.scaler.state_dict(),
        "sampler": p.sampler.state_dict(),
        "global_step": p.state.global_step,
        "best_val_acc": p.state.best_val_acc,
        "settings": dict(p.state.settings),
        "world_size": p.me.world_size,
    })
    p.state.written.append(path)
    prune_checkpoints(p.config.checkpoint_dir, p.state.written)
    p.me.reporter.emit("checkpoint", path=path, epoch=p.sampler.epoch,
                       step=p.sampler.steps_done, global_step=p.state.global_step)


def resume(config: RunConfig, me: Rank, model, optimizer, scheduler, scaler,
           sampler: ShardedBatchSampler, state: State) -> None:
    """Load the resume checkpoint, if asked for (the sampler then holds the position)."""
    if not config.resume:
        return
    if config.resume == "auto":
        found = find_resume_state(config.checkpoint_dir, config.model,
                                  lambda text: me.say(text, "warning") if me.is_main else None)
        if found is None:
            me.say(f"no usable checkpoint in {config.checkpoint_dir}: starting from scratch")
            return
        path, ckpt = found
    else:
        path = config.resume
        try:
            ckpt = load_checkpoint(path, config.model)
        except ValueError as e:
            raise UsageError(f"cannot resume from {path}: {e}") from None
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    scaler.load_state_dict(ckpt["scaler"])
    # The position is in global samples, so it holds even if the world size changed.
    sampler.load_state_dict(ckpt["sampler"])
    state.global_step = ckpt["global_step"]
    state.best_val_acc = ckpt["best_val_acc"]
    state.settings.update(ckpt["settings"])
    if config.workers is not None:
        state.settings["workers"] = config.workers
    torch.backends.cudnn.benchmark = state.settings["cudnn_benchmark"]
    me.say(f"resumed from {path}: epoch {sampler.epoch}, step {sampler.steps_done}")


def _count(n: int, noun: str) -> str:
    """'1 rank', '2 ranks'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
