"""One DDP rank's process: who it is, its process group, its reporting threads, then the
built pieces handed to the training loop (loop.py).

`main()` is the entry for ranks started by ddptui's supervisor and, through __main__.py, for
ranks started by torchrun or srun. Everything is built by plain functions from one RunConfig.
"""

from __future__ import annotations

import sys
import traceback

import torch
import torch.distributed as dist

from ddptui.contract.channel import load_key, parse_address
from ddptui.contract.gpu import DeviceSampler, physical_index
from ddptui.contract.options.config import RunConfig
from ddptui.contract.options.errors import DataError, UsageError
from ddptui.contract.protocol import events
from ddptui.contract.rankspec import RankSpec
from ddptui.contract.tensorboard import TensorBoardSink
from ddptui.contract.wording import count
from ddptui.rank.elastic import world
from ddptui.rank.elastic.control import CONTROL_OFF, Control, all_linked
from ddptui.rank.telemetry.heartbeat import Heartbeat
from ddptui.rank.telemetry.instrument import oom_line, out_of_memory
from ddptui.rank.telemetry.phases import NoClock
from ddptui.rank.telemetry.remote import RemoteLink, node_name
from ddptui.rank.telemetry.reporter import Reporter
from ddptui_trainer import member
from ddptui_trainer.build import build_parts, warm_up
from ddptui_trainer.loop import on_urgent, run_epochs
from ddptui_trainer.models import count_parameters
from ddptui_trainer.parts import Parts
from ddptui_trainer.rank import Rank


def main(spec: RankSpec, *, channel=None, inbox=None, forming: world.Forming | None = None) -> int:
    """Train as one rank; return the process exit code (0 done, 1 failed, 2 bad input).

    A standby builds everything, warms up and waits for the supervisor to let it join.
    `channel`, `inbox`: the supervisor's pipes (None under torchrun or srun).
    `forming`: the process group already being formed (on cuda:0 or the CPU)."""
    config = spec.config
    me = _whoami(spec, channel)
    supervised = channel is not None
    link = _remote_link(config, me) if config.telemetry.report and not supervised else None
    inbox = link.inbox if link is not None else inbox
    watchers = _watchers(config, me, supervised) if config.telemetry.hz > 0 else []
    code = 1
    try:
        control_group = sockets = None
        if not spec.standby:
            control_group, sockets = forming.result() if forming is not None else \
                world.form(spec.rank, spec.world_size, me.device, spec.init_method)
            if not supervised:
                inbox = _agree_on_control(me, inbox, control_group)
            _announce_world(config, me, link)
        for thread in watchers:
            thread.start()
        train(config, me, inbox, control_group, sockets, supervised)
        code = 0
    except (UsageError, DataError) as e:
        text = _one_line(e)
        me.reporter.emit(events.Usage(rank=me.reporter.rank, level="error", text=text))
        if spec.echo or channel is None:
            print(f"error: {text}", file=sys.stderr, flush=True)
        code = 2
    except Exception as e:
        traceback.print_exc()
        me.reporter.emit(events.Notice(rank=me.reporter.rank,
                                       level="error", text=f"{type(e).__name__}: {_one_line(e)}"))
    finally:
        for thread in watchers:
            thread.stop()
        _close(me, link, code)
    return code


def _whoami(spec: RankSpec, channel) -> Rank:
    """This process's Rank: its device (the one visible GPU, or cuda:LOCAL_RANK under
    torchrun, or the CPU) and where its events go."""
    config, physical_gpu = spec.config, spec.physical_gpu
    use_cuda = torch.cuda.is_available() and config.devices.cpus is None
    local = spec.rank if spec.local_rank is None else spec.local_rank
    device = torch.device("cuda", 0 if physical_gpu is not None else local) if use_cuda else \
        torch.device("cpu")
    if use_cuda:
        if physical_gpu is None:
            found = physical_index(local)
            physical_gpu = local if found is None else found
        torch.cuda.set_device(device)  # (a Forming thread set it on its own thread only)
    reporter = Reporter(spec.slot, channel, config.telemetry.log if channel is None else None)
    me = Rank(spec.slot, spec.rank, spec.world_size, device, physical_gpu if use_cuda else None,
              reporter, spec.echo, spec.standby)
    if config.telemetry.tensorboard:
        me.reporter.sinks.append(TensorBoardSink(config.telemetry.tensorboard, f".rank{spec.slot}"))
    return me


def _remote_link(config: RunConfig, me: Rank) -> RemoteLink:
    """Under torchrun or srun with --report: events to `ddptui attach`, its commands back."""
    link = RemoteLink(parse_address(config.telemetry.report, "--report"), load_key()[0], node_name(),
                      lambda text: print(f"rank {me.rank}: {text}", file=sys.stderr, flush=True))
    me.reporter.sinks.append(link)
    return link


def _announce_world(config: RunConfig, me: Rank, link: RemoteLink | None) -> None:
    me.announce("running")
    me.say(f"process group ready: {count(me.world_size, 'rank')} on {dist.get_backend()}")
    if link is not None and me.is_main:
        me.reporter.emit(events.Run(rank=me.reporter.rank,
                                    status="started", model=config.model.name, data=config.data.spec,
                         epochs=config.train.epochs, world_size=me.world_size,
                         device_kind=me.device.type, batch_size=config.train.batch_size))


def _close(me: Rank, link: RemoteLink | None, code: int) -> None:
    """Leave the process group and flush every sink; without a supervisor, say how it ended."""
    if dist.is_initialized():
        world.dismantle(lambda text: me.say(text, "warning"), collect=True)
    if link is not None:
        me.announce("done" if code == 0 else "crashed", exit_code=code)
        if me.is_main:
            me.reporter.emit(events.Run(rank=me.reporter.rank,
                                        status="done" if code == 0 else "failed", exit_code=code))
    me.reporter.close()


def _watchers(config: RunConfig, me: Rank, supervised: bool) -> list:
    """The rank's reporting threads: under ddptui run a heartbeat (the parent samples the GPUs);
    under torchrun or srun a device sampler per GPU it drives (DataParallel drives them all)."""
    if supervised:
        return [Heartbeat(me.pulse, me.reporter.rank, me.reporter.emit)]
    gpus = list(config.devices.gpus) if config.devices.strategy == "dp" and me.device.type == "cuda" \
        else [me.physical_gpu]
    return [DeviceSampler(me.reporter.rank, me.reporter.emit, lambda t: me.say(t, "warning"), g)
            for g in gpus]


def _agree_on_control(me: Rank, inbox, group):
    """Commands need every rank in the control exchange: with a dashboard link on some ranks
    only (an environment variable set on one node), control stays off everywhere."""
    every_rank = all_linked(inbox is not None, group)  # a collective: every rank takes part
    if inbox is not None and not every_rank:
        me.say(CONTROL_OFF, "warning")
        return None
    return inbox


def _one_line(e: Exception) -> str:
    # DataLoader re-raises a worker's exception with the worker traceback in the message.
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()] or [type(e).__name__]
    last = lines[-1]
    for cls in (DataError, UsageError):  # as the worker's traceback names them
        last = last.removeprefix(f"{cls.__module__}.{cls.__qualname__}: ")
    return last


def train(config: RunConfig, me: Rank, inbox, control_group, sockets, supervised: bool) -> None:
    """Build everything, enter the world (a standby waits to join), then run epochs."""
    p = build_parts(config, me, inbox, supervised, on_urgent)
    try:
        _train(p, me, control_group, sockets)
    except Exception as e:
        if out_of_memory(e) and not isinstance(p.clock, NoClock):  # its phase, and its peak
            me.say(oom_line(p.clock).removeprefix("ddptui: "), "error")
        raise


def _train(p: Parts, me: Rank, control_group, sockets) -> None:
    try:
        if me.standby:
            warm_up(p)
            if me.device.type == "cuda":
                world.preload_nccl(me.device)
            me.announce("standby")
            if not member.join(p):
                return
        else:
            p.ddp = member.wrap(p.model, me, p.config.devices.strategy, clock=p.clock)
            p.control = Control(p.mailbox, me.rank, control_group)
            if p.mailbox is not None:  # no supervisor (torchrun, srun): nobody orders a recovery
                p.mailbox.world_sockets = sockets
            describe_start(p)
        done = run_epochs(p)
        p.clock.flush()  # the last window's steps
        if done:
            me.say("training done")
    finally:
        if p.control is not None:
            p.control.finish()
        p.loaders.close()
        p.loaders.bad.close()
        if p.checkpoints is not None:
            p.checkpoints.wait()  # the last checkpoint is on disk before the rank reports its end


def describe_start(p: Parts) -> None:
    """The model summary, the settings in force, and what this kind of rank cannot do."""
    me, config, bundle = p.me, p.config, p.loaders.bundle
    params, steps = count_parameters(p.model), p.sampler.steps_done + len(p.sampler)
    me.say(f"{config.model.name}: {params / 1e6:.1f}M parameters, {bundle.num_classes} "
           f"classes, {bundle.num_train} training samples, {steps} steps per epoch",
           kind=events.Facts, steps_per_epoch=steps, num_train=bundle.num_train,
           num_classes=bundle.num_classes, params=params)
    if me.is_main:
        me.reporter.emit(events.Settings(rank=me.reporter.rank, settings=dict(p.state.settings),
                                         epoch=p.sampler.epoch, status="applied"))
    if me.device.type != "cuda" and p.state.settings["prefetch"] and config.data.decode != "gpu":
        me.say("prefetcher needs CUDA: CPU ranks load batches directly")
    if config.devices.strategy == "dp":
        me.say("--strategy dp: cudnn.benchmark is off (DataParallel's per-step threads "
               "would autotune again every step)")
    if p.loaders.bundle.collate is not None:  # --decode gpu: JPEGs to the rank
        codec = p.loaders.prepare.codec.name
        where = "on the GPU" if me.device.type == "cuda" else "in the rank process (CPU rank)"
        me.say(f"--decode gpu: JPEGs decoded {where} by {codec}", kind=events.Facts, decoder=codec)


