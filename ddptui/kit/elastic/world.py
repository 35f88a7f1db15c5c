"""The world a rank trains in: forming its process group, and changing it while training goes on.

Ranks leave or join at an agreed step (the old group is intact: a plain re-form), or lose a peer
(the old group is broken: abort, re-form from the survivors, roll back to a common point).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptui.kit.compat import abort_process_group, default_group, set_group_timeout
from ddptui.kit.elastic.control import Control, Mailbox
from ddptui.kit.elastic.snapshot import WorldLost, agree, state_tensors
from ddptui.kit.elastic.sockets import Sockets, open_sockets
from ddptui.kit.elastic.store import arrive, kept_on_failure, meet

# How long gloo may take to connect a world's members, who have all met at its store by then
# (and again before the control group: ARRIVED_AGAIN, where a script's joiner meets them too).
# gloo waits five times this for a pair's peer to connect, and nothing else wakes that wait:
# with a member that died after the meeting, a long timeout outlasted the change timeout, which
# then killed the survivor too (the run lost). Live members that met connect in milliseconds.
# Their collectives get the default back once connected. A script's joiner meets them at the
# first meeting (it came early) and waits inside its script's init_process_group when they come
# (on CPUs: gloo connects there; a joiner killed then left the survivor waiting 5 x 30 s). A
# world formed with no meeting (an init method other than tcp:// and env://) keeps 30 s.
CONNECT = timedelta(seconds=1)
CONNECT_UNMET = timedelta(seconds=30)
ARRIVED_AGAIN = "ddptui/arrived-control"

if TYPE_CHECKING:
    from ddptui_trainer.parts import Parts
    from ddptui_trainer.rank import Rank


def form(rank: int, world_size: int, device: torch.device, init_method: str,
         eager: bool = True, mailbox: Mailbox | None = None):
    """Join the process group at `init_method` as `rank` of `world_size`: nccl on GPUs, gloo
    on CPUs; returns the small gloo group that carries live commands, and on CPUs the
    connections the world was made of (cut when a peer dies: ddptui/kit/elastic/sockets.py).
    `eager`: NCCL's communicator is begun inside init_process_group (device_id); every member
    must choose alike (a script's joiner forms its world as the script does).
    `mailbox`: where a world ddptui ordered learns that a member died meanwhile (then a
    recovery follows): rank 0 may have died before its store listened."""
    give_up = (lambda: mailbox.has_urgent) if mailbox is not None else (lambda: False)
    before = open_sockets()
    store = meet(init_method, rank, world_size, give_up)
    if mailbox is not None:
        mailbox.met()
    # The prefix init_method's stores get: a script's joiner forms its world from env://.
    where = {"init_method": init_method} if store is None else {
        "store": dist.PrefixStore("default_pg", store)}
    with kept_on_failure(store):
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device if eager else None,
                                    pg_options=nonblocking(), rank=rank, world_size=world_size,
                                    **where)
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                    timeout=connect_within(store), **where)
        group = control_group(store, world_size, give_up)
        if device.type == "cuda":
            make_communicator(device)
    if device.type != "cuda":
        set_group_timeout(dist.default_pg_timeout, dist.group.WORLD)
    return group, Sockets() if device.type == "cuda" else open_sockets() - before


def control_group(store: dist.Store | None, world_size: int,
                  give_up: Callable[[], bool] = lambda: False):
    """The world's small gloo group that carries live commands, made once every member came to
    make it (`store`, the world's; a script's joiner comes from its run.elastic()): NCCL's
    set-up, and a joiner's script between its init_process_group and run.elastic(), take each
    member its own time. Its pairs then connect in CONNECT, and a member that died before it
    came is noticed by `give_up` (a survivor waited in gloo 5 x 30 s for a joiner killed just
    after it said it was prepared: the run lost, 2 x H200)."""
    if store is not None:
        arrive(store, ARRIVED_AGAIN, world_size, give_up)
    group = dist.new_group(backend="gloo", timeout=connect_within(store))
    set_group_timeout(dist.default_pg_timeout, group)
    return group


def connect_within(store: dist.Store | None) -> timedelta:
    """How long gloo may take to connect a world's members: CONNECT once they met at `store`."""
    return CONNECT if store is not None else CONNECT_UNMET


def make_communicator(device: torch.device) -> None:
    """The world's NCCL communicator, made (or, eager, waited for) now by every member (a
    joiner as soon as it made its world's gloo group, as form() does), while the world forms
    and no abort comes: a peer that died before it made its part left the others inside NCCL's
    set-up, where the abort could not reach them (the run was lost). A set-up that waits for a
    dead member is failed by the recover order (its listening sockets shut: Mailbox), or ends
    by itself (TORCH_NCCL_NONBLOCKING_TIMEOUT, trainer/bootstrap.py)."""
    dist.all_reduce(torch.zeros(1, device=device))


def nonblocking():
    """NCCL options under which a communicator's set-up that waits for a dead member ends
    (TORCH_NCCL_NONBLOCKING_TIMEOUT): a blocking one waits in ncclCommInitRank for ever."""
    options = dist.ProcessGroupNCCL.Options()
    options.config.blocking = 0
    return options


def form_ordered(mailbox: Mailbox, rank: int, world_size: int, device: torch.device,
                 init_method: str, eager: bool = True):
    """form() for a world ddptui ordered; a member's death meanwhile raises WorldLost (or the
    error of a cut connection) at once, and its recover order follows."""
    with mailbox.forming(urllib.parse.urlsplit(init_method).port, own_store=rank == 0,
                         nccl=device.type == "cuda"):
        if mailbox.has_urgent:
            raise WorldLost("a peer died before the world formed")
        group, mailbox.world_sockets = form(rank, world_size, device, init_method, eager,
                                            mailbox)
    if mailbox.has_urgent:  # formed as the order came: not aborted then (control.py)
        raise WorldLost("a peer died as the world formed")
    return group


def preload_nccl(device: torch.device) -> None:
    """NCCL loads its kernels when a process makes its first communicator (inside a joiner's
    init, while the ranks it joins waited): a standby makes a group of its own first,
    then drops it."""
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=device)
    dist.destroy_process_group()


def made_eagerly() -> bool:
    """Whether the current world's NCCL communicator was made at its init (device_id given)
    rather than at its first use. A script's joiner forms its world as the script does, so each
    world ddptui forms for the script's survivors is formed alike: an eager survivor waited in
    its init for a joiner that waited for it in new_group."""
    return getattr(default_group(), "bound_device_id", None) is not None


class Forming:
    """form() on a thread, started as soon as torch is imported: the CUDA context, the
    rendezvous and NCCL's set-up (0.8 s on H200) overlap the import of torchvision and the
    trainer (3.5 s). result() returns what form() does or raises its error."""

    def __init__(self, rank: int, world_size: int, device: torch.device, init_method: str):
        self._group, self._error = None, None
        self._thread = threading.Thread(target=self._form, name="form", daemon=True,
                                        args=(rank, world_size, device, init_method))
        self._thread.start()

    def _form(self, *args) -> None:
        try:
            self._group = form(*args)
        except BaseException as e:  # handed to the main thread, which reports it
            self._error = e

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._group


def wrap(model: torch.nn.Module, me: Rank, strategy: str = "ddp",
         in_sync: bool = False) -> torch.nn.Module:
    """DDP over the current world (its construction checks the shapes and broadcasts rank 0's
    parameters, unless every member is known to hold the same state already), or DataParallel
    over this process's GPUs for --strategy dp."""
    if strategy == "dp" and me.device.type == "cuda":
        return torch.nn.DataParallel(model, device_ids=list(range(torch.cuda.device_count())))
    return DDP(model, device_ids=[me.device.index] if me.device.type == "cuda" else None,
               gradient_as_bucket_view=True, init_sync=not in_sync)


def abort(warn: Callable[[str], None]) -> None:
    """Unblock collectives waiting on a dead peer (NCCL would wait until its timeout)."""
    if not dist.is_initialized():  # already destroyed: nothing is waiting then
        return
    try:
        abort_process_group()
    except Exception as e:  # ranks may stay blocked in NCCL: the user must hear of it
        warn(f"aborting the process group failed: {type(e).__name__}: {e}")


def dismantle(warn: Callable[[str], None], collect: bool) -> None:
    """Drop the current process group; after an abort it is already gone. Its connections close
    once nothing refers to it: after a peer died, collect=True makes that happen now (the
    mailbox has cut a gloo world's connections already: ddptui/kit/elastic/sockets.py). An agreed
    change leaves nobody blocked, and a full collection costs it 0.1-0.3 s. A world still here
    after a death is one that was being formed (the mailbox aborts no such world): on NCCL it
    is aborted now, as destroying it waits for ever for the dead member's part."""
    if collect and dist.is_initialized() and dist.get_backend() == "nccl":
        abort(warn)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as e:
            warn(f"destroying the process group failed: {type(e).__name__}: {e}")
    if collect:
        gc.collect()


def reform(p: Parts, order: dict) -> bool:
    """Apply an agreed leave or join; False when this rank is the one leaving."""
    p.me.pulse.phase = "world"
    leftover = p.control.finish()
    p.state.mark("agree")
    old_world = p.me.world_size
    p.ddp = p.control = None
    leaving = p.me.slot not in order["members"]
    try:
        with changing(p):
            dismantle(lambda text: p.me.say(text, "warning"), collect=False)
            p.state.mark("close")
            if leaving:
                return False
            group = enter(p, order)
            p.state.mark("form")
            if order.get("joiner") is not None:
                share_state(p, order, group)
                p.state.mark("state")
            settle(p, group, old_world, leftover, order)
    except WorldLost:
        if leaving:  # a member died as this one left: the world it left is no concern of it
            return False
        raise
    return True


def join(p: Parts) -> bool:
    """A standby waits for its join order, enters the world and takes a live rank's state."""
    p.me.pulse.phase = "world"
    order = p.mailbox.wait_urgent(None)
    if order is None or order.get("op") != "join":
        return False
    p.state.changed_at = time.time()
    with changing(p):
        group = enter(p, order)
        p.state.mark("form")
        trained_under = share_state(p, order, group)
        p.state.mark("state")
        settle(p, group, trained_under, [], order)
    return True


def recover(p: Parts, order: dict) -> int:
    """After a peer died: re-form from the survivors and roll back to the newest point they all
    hold and know to be good; returns the number of steps that will be redone."""
    p.me.pulse.phase = "world"
    p.ddp = p.control = p.orders.reform = None  # a change agreed before the death is void
    with changing(p):
        dismantle(lambda text: p.me.say(text, "warning"), collect=True)
        p.state.mark("close")
        old_world = p.me.world_size
        group = enter(p, order)
        p.state.mark("form")
        summaries: list = [None] * p.me.world_size
        dist.all_gather_object(summaries, p.snapshots.summary(), group=group)
        target = agree(summaries)
        if target is None:
            raise RuntimeError("a rank died and the survivors share no rollback point")
        redone = p.state.global_step - target
        load_host_state(p, p.snapshots.restore(target))
        p.state.mark("rollback")
        settle(p, group, old_world, [], order)
    return redone


def changing(p: Parts) -> contextlib.AbstractContextManager:
    """Mailbox.changing, where a supervisor sends orders."""
    return p.mailbox.changing() if p.mailbox is not None else contextlib.nullcontext()


def enter(p: Parts, order: dict):
    """Take this rank's place in the order's world and form it; returns the control group."""
    members = order["members"]
    p.me.rank, p.me.world_size = members.index(p.me.slot), len(members)
    return form_ordered(p.mailbox, p.me.rank, p.me.world_size, p.me.device, order["init"])


def settle(p: Parts, group, old_world: int, leftover: list[dict], order: dict) -> None:
    """Everything that follows a new world: shards, lr, DDP, control, a fresh rollback point."""
    p.sampler.set_world(p.me.rank, p.me.world_size)
    if p.config.train.lr_scaling == "linear" and old_world != p.me.world_size:
        rescale_lr(p, p.me.world_size / old_world)
    # Members that stayed hold the same state, a joiner has just been sent it, and a recovery
    # restored a common point: DDP's own check and broadcast would be a second round trip.
    p.ddp = wrap(p.model, p.me, p.config.devices.strategy, in_sync=True)
    p.state.mark("ddp")
    p.control = Control(p.mailbox, p.me.rank, group)
    p.loaders.reshard()
    p.state.mark("loaders")
    p.me.announce("running", world_rank=p.me.rank)
    if p.me.is_main:
        p.mailbox.requeue(leftover)
        p.me.reporter.emit("world", size=p.me.world_size, ranks=order["members"],
                           generation=order.get("gen"), epoch=p.sampler.epoch,
                           step=p.sampler.steps_done, global_step=p.state.global_step,
                           base_lr=p.scheduler.base_lrs[0])
    if p.snapshots is not None:
        p.snapshots.take(p.state.global_step, host_state(p), agreed=True)
    p.state.mark("settle")


def rescale_lr(p: Parts, factor: float) -> None:
    """--lr-scaling linear: the lr follows the world size."""
    for g in p.optimizer.param_groups:
        g["lr"] *= factor
        g["initial_lr"] *= factor
    p.scheduler.base_lrs = [lr * factor for lr in p.scheduler.base_lrs]


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


def share_state(p: Parts, order: dict, group) -> int:
    """The first member that is not the joiner sends its whole training state; returns the
    world size it was trained under (the lr in that state is scaled for it). Its host part
    goes over the gloo `group`, which a dead member fails at once, not over NCCL, where it
    waited in a device sync that only an abort would end."""
    members = order["members"]
    src = members.index(next(s for s in members if s != order["joiner"]))
    sending = p.me.rank == src
    box = [None]
    if sending:
        box = [{**host_state(p), "world_size": p.me.world_size, "paused": p.orders.paused,
                "settings": dict(p.state.settings), "pending": dict(p.state.pending),
                "best_val_acc": p.state.best_val_acc}]
    dist.broadcast_object_list(box, src=src, group=group)
    if p.snapshots is not None:  # a rollback point still being copied out reads these
        p.snapshots.before_update()
    for t in state_tensors(p.model, p.optimizer, p.scaler):
        dist.broadcast(t, src=src)
    meta = box[0]
    if not sending:
        load_host_state(p, meta)
        p.orders.paused, p.state.best_val_acc = meta["paused"], meta["best_val_acc"]
        p.state.settings.update(meta["settings"])
        p.state.pending = dict(meta["pending"])
        torch.backends.cudnn.benchmark = p.state.settings["cudnn_benchmark"]
        p.loaders.apply(p.state.settings)
    return meta["world_size"]
