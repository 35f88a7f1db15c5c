"""The world a rank trains in: forming its process group, and changing it while training goes on.

Ranks leave or join at an agreed step (the old group is intact: a plain re-form), or lose a peer
(the old group is broken: abort, re-form from the survivors, roll back to a common point).
"""

from __future__ import annotations

import gc
import threading
import urllib.parse
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from ddptui.rank.compat import abort_process_group, default_group, set_group_timeout
from ddptui.rank.elastic.control import Mailbox
from ddptui.rank.elastic.snapshot import WorldLost
from ddptui.rank.elastic.sockets import Sockets, open_sockets
from ddptui.rank.elastic.store import arrive, kept_on_failure, meet

# How long gloo may take to connect a world's members, who have all met at its store by then
# (and again before the control group: ARRIVED_AGAIN, where a script's joiner meets them too).
# gloo waits five times this for a pair's peer to connect and nothing else wakes that wait, so
# it must stay well under the change timeout; live members that met connect in milliseconds.
# Their collectives get the default back once connected. A script's joiner meets them at the
# first meeting (it came early) and waits inside its script's init_process_group when they come.
CONNECT = timedelta(seconds=1)
ARRIVED_AGAIN = "ddptui/arrived-control"


def form(rank: int, world_size: int, device: torch.device, init_method: str,
         eager: bool = True, mailbox: Mailbox | None = None):
    """Join the process group at `init_method` as `rank` of `world_size`: nccl on GPUs, gloo
    on CPUs; returns the small gloo group that carries live commands, and on CPUs the
    connections the world was made of (cut when a peer dies: ddptui/rank/elastic/sockets.py).
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
    where = {"store": dist.PrefixStore("default_pg", store)}
    with kept_on_failure(store):
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device if eager else None,
                                    pg_options=nonblocking(), rank=rank, world_size=world_size,
                                    **where)
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                    timeout=CONNECT, **where)
        group = control_group(store, world_size, give_up)
        if device.type == "cuda":
            make_communicator(device)
    if device.type != "cuda":
        set_group_timeout(dist.default_pg_timeout, dist.group.WORLD)
    return group, Sockets() if device.type == "cuda" else open_sockets() - before


def control_group(store: dist.Store, world_size: int,
                  give_up: Callable[[], bool] = lambda: False):
    """The world's small gloo group that carries live commands, made once every member came to
    make it (`store`, the world's; a script's joiner comes from its run.elastic()): NCCL's
    set-up, and a joiner's script between its init_process_group and run.elastic(), take each
    member its own time. Its pairs then connect in CONNECT, and a member that died before it
    came is noticed by `give_up`, not by gloo's wait for a peer that never connects."""
    arrive(store, ARRIVED_AGAIN, world_size, give_up)
    group = dist.new_group(backend="gloo", timeout=CONNECT)
    set_group_timeout(dist.default_pg_timeout, group)
    return group


def make_communicator(device: torch.device) -> None:
    """The world's NCCL communicator, made (or, eager, waited for) now by every member (a
    joiner as soon as it made its world's gloo group, as form() does), while the world forms
    and no abort comes: a peer that died before it made its part would leave the others inside
    NCCL's set-up, where no abort reaches. A set-up that waits for a
    dead member is failed by the recover order (its listening sockets shut: Mailbox), or ends
    by itself (TORCH_NCCL_NONBLOCKING_TIMEOUT, ddptui/contract/environment.py)."""
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
    mailbox has cut a gloo world's connections already: ddptui/rank/elastic/sockets.py). An agreed
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
