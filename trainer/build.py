"""Building a rank's pieces with plain functions, as the PyTorch ImageNet example does: torch's
switches, the model on its device, the optimizer and schedule, the loaders and meters, resuming
from a checkpoint, and a standby's warm-up.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ddptui.contract.options.config import RunConfig
from ddptui.contract.options.errors import UsageError
from ddptui.rank.elastic import world
from ddptui.rank.elastic.control import Mailbox, OrderPipe
from ddptui.rank.elastic.snapshot import Snapshots, buffer_count, state_tensors
from ddptui.rank.sampler import ShardedBatchSampler
from ddptui.rank.telemetry.instrument import clock_on
from ddptui.rank.telemetry.phases import NoClock, StepClock
from ddptui.rank.telemetry.reporter import StepMeter
from ddptui_trainer.checkpoint import Writer, announce_checkpoint, find_resume_state, load_checkpoint
from ddptui_trainer.models import build_model
from ddptui_trainer.orders import LoopOrders
from ddptui_trainer.parts import Parts, State
from ddptui_trainer.pipeline.datasets import DataBundle, build_datasets
from ddptui_trainer.pipeline.loaders import Loaders
from ddptui_trainer.rank import Rank


def build_parts(config: RunConfig, me: Rank, inbox, supervised: bool,
                on_urgent: Callable[[dict, Parts], None]) -> Parts:
    """Everything the loop needs, for the world the run started with (a joining rank takes
    its position, and the lr that goes with the world it joins, from a live rank)."""
    if config.devices.strategy == "dp" and me.device.type == "cuda":
        # DataParallel splits each batch across the GPUs: --batch-size stays per GPU.
        config = config.replace(batch_size=config.train.batch_size * torch.cuda.device_count())
    configure_torch(config, me)
    bundle = build_datasets(config, progress=me.say)
    model = build_model_on(config, me, bundle)
    sampler = ShardedBatchSampler(bundle.num_train, config.train.batch_size, me.rank, me.world_size,
                                  seed=config.train.seed, max_steps=config.train.steps_per_epoch)
    total_steps = config.train.epochs * len(sampler)
    if total_steps == 0:
        raise UsageError(f"{bundle.num_train} training samples make no step of "
                         f"{config.train.batch_size} x {me.world_size} ranks: lower --batch-size")
    optimizer, scheduler = build_optimizer(config, model, me.world_size, total_steps)
    scaler = torch.amp.GradScaler(me.device.type, enabled=config.model.amp == "fp16")
    scaler.scale(torch.zeros((), device=me.device))  # creates its state tensors now
    state = State(settings=config.settings(me.world_size))
    p = Parts(config=config, me=me, model=model, optimizer=optimizer, scheduler=scheduler,
              scaler=scaler, sampler=sampler,
              loaders=Loaders(config, me, bundle, sampler, state.settings,
                              amp_dtype(config) if me.device.type == "cuda" else None),
              meter=StepMeter(me.reporter, config.telemetry.hz, config.train.batch_size, me.device,
                              sampler.progress),
              autocast=build_autocast(config, me.device), state=state,
              clock=StepClock(me.reporter.rank, me.reporter.emit, me.device) if clock_on()
              else NoClock())
    if not me.standby:  # (the loaders read the position and the settings only when they start)
        resume(p)
    if config.checkpoint.dir and me.is_main:
        p.checkpoints = Writer(config.checkpoint.dir, lambda path, saved: announce_checkpoint(
            me, path, saved))
    if inbox is not None:  # live commands (ddptui run or attach)
        p.mailbox = Mailbox(OrderPipe(inbox), lambda order: on_urgent(order, p))
        if me.device.type == "cuda":  # NCCL's collectives waiting on a dead peer return
            p.mailbox.abort = lambda: world.abort(lambda text: me.say(text, "warning"))
        if supervised and config.checkpoint.snapshot_every:  # recovery needs our supervisor's orders
            p.snapshots = Snapshots(state_tensors(model, optimizer, scaler),
                                    me.device.type == "cuda", buffers=buffer_count(model))
    p.orders = LoopOrders(p)
    return p


def build_model_on(config: RunConfig, me: Rank, bundle: DataBundle) -> torch.nn.Module:
    with me.device:  # initialised where it trains: no CPU init and copy (1 s for resnet50)
        model = build_model(config.model.name, bundle.num_classes, bundle.in_channels,
                            config.data.resolved_image_size)
    model = model.to(me.device)  # a user's model may pin its own tensors elsewhere
    if config.model.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if config.model.sync_bn:
        if me.device.type == "cuda":
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        else:
            me.say("--sync-bn needs CUDA ranks; using per-rank BatchNorm", "warning")
    return model


def configure_torch(config: RunConfig, me: Rank) -> None:
    torch.manual_seed(config.train.seed)
    if me.device.type == "cpu":
        # Ranks share the host's cores; oversubscribed intra-op threads thrash.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // me.world_size))
    torch.backends.cudnn.benchmark = config.model.cudnn_benchmark
    if config.train.deterministic:
        torch.backends.cudnn.deterministic = True
        torch.use_deterministic_algorithms(True, warn_only=True)
    if config.model.amp == "off" and me.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def _initial_state(optimizer: str, p: torch.Tensor, cuda: bool) -> dict:
    if optimizer == "sgd":
        return {"momentum_buffer": torch.zeros_like(p, memory_format=torch.preserve_format)}
    # Fused AdamW keeps its step count on the device (a collective can send it), else on the host.
    step = torch.zeros((), dtype=torch.float32, device=p.device if cuda else "cpu")
    return {"step": step, "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}


def build_optimizer(config: RunConfig, model: torch.nn.Module, world_size: int,
                    total_steps: int):
    """SGD with Nesterov momentum or AdamW (no decay on norms and biases either way) and a
    warm-up + cosine schedule."""
    lr = config.train.lr or (1e-3 if config.train.optimizer == "adamw" else 0.05)
    lr *= world_size if config.train.lr_scaling == "linear" else 1
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]  # norms and biases
    groups = [{"params": decay, "weight_decay": config.train.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    cuda = next(model.parameters()).is_cuda
    if config.train.optimizer == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=lr, fused=cuda)
    else:
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=config.train.momentum, nesterov=True)
    for p in model.parameters():
        # Made now rather than at the first step (zeros give the same first update), so the
        # state has one shape from the start: rollback points and joining ranks rely on it.
        optimizer.state[p].update(_initial_state(config.train.optimizer, p, cuda))
    warmup = max(1, total_steps // 10)

    def factor(step: int) -> float:
        # Linear warm-up, then cosine decay; clamped, since a resumed or re-sharded run may
        # take more steps than planned.
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def amp_dtype(config: RunConfig) -> torch.dtype | None:
    """--amp's dtype; None with --amp off."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.model.amp)


def build_autocast(config: RunConfig, device: torch.device):
    """A context factory: autocast to --amp's dtype, or a no-op with --amp off."""
    dtype = amp_dtype(config)
    return lambda: torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def warm_up(p: Parts) -> None:
    """One forward and backward at the training shapes, so that cudnn has chosen its
    algorithms before the join instead of stalling the ranks it joins."""
    size, channels = p.config.data.resolved_image_size, p.loaders.bundle.in_channels
    images = torch.zeros(p.config.train.batch_size, channels, size, size, device=p.me.device)
    if p.config.model.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.zeros(p.config.train.batch_size, dtype=torch.long, device=p.me.device)
    with p.autocast():
        loss = F.cross_entropy(p.model(images), labels)
    p.scaler.scale(loss).backward()
    p.optimizer.zero_grad(set_to_none=True)
    p.loaders.start_workers()
    if p.me.device.type == "cuda":
        torch.cuda.synchronize(p.me.device)


def resume(p: Parts) -> None:
    """Load the resume checkpoint, if asked for (the sampler then holds the position)."""
    config, me, sampler, state = p.config, p.me, p.sampler, p.state
    if not config.checkpoint.resume:
        return
    if config.checkpoint.resume == "auto":
        found = find_resume_state(config.checkpoint.dir, config.model.name, config.train.optimizer,
                                  lambda text: me.say(text, "warning") if me.is_main else None)
        if found is None:
            me.say(f"no usable checkpoint in {config.checkpoint.dir}: starting from scratch")
            return
        path, ckpt = found
    else:
        path = config.checkpoint.resume
        try:
            ckpt = load_checkpoint(path, config.model.name, config.train.optimizer)
        except ValueError as e:
            raise UsageError(f"cannot resume from {path}: {e}") from None
    p.model.load_state_dict(ckpt["model"])
    p.optimizer.load_state_dict(ckpt["optimizer"])
    p.scheduler.load_state_dict(ckpt["scheduler"])
    p.scaler.load_state_dict(ckpt["scaler"])
    # The position is in global samples, so it holds even if the world size changed.
    sampler.load_state_dict(ckpt["sampler"])
    state.global_step = ckpt["global_step"]
    state.best_val_acc = ckpt["best_val_acc"]
    state.settings.update(ckpt["settings"])
    if config.data.workers is not None:
        state.settings["workers"] = config.data.workers
    torch.backends.cudnn.benchmark = state.settings["cudnn_benchmark"]
    me.say(f"resumed from {path}: epoch {sampler.epoch}, step {sampler.steps_done}")
