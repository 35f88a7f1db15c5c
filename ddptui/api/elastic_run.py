"""run.elastic() for your own script: rollback points of the state your functions return, a rank
that leaves at an agreed step (s), the survivors' recovery after a peer died (k, a crash), and
run.ddp(), the DistributedDataParallel model that is built again over each new world.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptui.api.joiner import Joiner
from ddptui.api.rankside import RankSide
from ddptui.api.rollback import Rollback
from ddptui.api.steering import Orders
from ddptui.contract.events import count
from ddptui.kit.elastic import world
from ddptui.kit.elastic.snapshot import WorldLost, agree

POINT_EVERY = 50  # steps between rollback points (and at every epoch's start)


class ElasticDDP(torch.nn.Module):
    """What run.ddp(module, **kwargs) returns: DistributedDataParallel(module, **kwargs) over the
    current world, built again when the world changes. Use it as the DDP model: `.module` is
    your model, and its state_dict has DDP's keys."""

    def __init__(self, module: torch.nn.Module, in_sync: bool = False, **kwargs):
        super().__init__()
        self.module = module
        self.before_forward: Callable[[], None] = lambda: None
        self._kwargs = kwargs
        self.rebuild(in_sync)  # a joining rank: its state comes from run.elastic()

    def rebuild(self, in_sync: bool) -> None:
        """DDP over the world that is current now. `in_sync`: every member holds the same state
        already (DDP's own check and broadcast would be a second round trip)."""
        # Kept out of the module tree: its parameters are `module`'s own.
        object.__setattr__(self, "ddp", None)  # the old reducer goes before the new one comes
        object.__setattr__(self, "ddp", DDP(self.module, init_sync=not in_sync, **self._kwargs))

    def forward(self, *args, **kwargs):
        self.before_forward()
        return self.ddp(*args, **kwargs)

    def no_sync(self):
        return self.ddp.no_sync()

    def train(self, mode: bool = True) -> ElasticDDP:
        super().train(mode)
        self.ddp.train(mode)
        return self


class Elastic:
    """The elastic half of a Run: it changes the run's world (a leave, a join, a recovery) and
    takes its rollback points at safe steps."""

    def __init__(self, me: RankSide, orders: Orders, state_fn: Callable[[], Any],
                 load_fn: Callable[[Any], None], model: ElasticDDP, every: int = POINT_EVERY):
        self.me, self.orders, self.model, self.every = me, orders, model, every
        self.device = next(model.module.parameters()).device
        self.cuda = self.device.type == "cuda"
        self.eager = world.made_eagerly()  # each world is formed as the script formed its first
        self.rollback = Rollback(state_fn, load_fn, model.module, self.cuda)
        self.order: dict | None = None  # a recover order, carried out at the next safe point
        model.before_forward = self.rollback.before_forward
        orders.on_reform = self.reform

    def start(self, joining: Joiner | None) -> None:
        """Orders that cannot wait reach the points; a standby's script joins its world now."""
        self.me.mailbox.on_urgent = self.rollback.on_urgent
        if self.cuda:  # NCCL's collectives waiting on a dead peer return
            self.me.mailbox.abort = lambda: world.abort(self._warn)
        if joining is not None:
            joining.prepared()
            self.join(joining)
        for live in self.me.loaders:
            self.adopt(live)

    def step_end(self) -> bool:
        """After a step: a lost peer noticed, orders agreed (a leave among them), a rollback
        point taken when one is due. False when the world broke here."""
        me = self.me
        try:
            self.check_lost()
            self.rollback.step_done(me.global_step)
            self.orders.take()
        except Exception as e:
            if self.await_recover(e) is None:
                raise
            return False
        if me.global_step % self.every == 0:
            self.rollback.take(me.global_step, me.position())
        return True

    def recover_pending(self) -> bool:
        """A recover order kept from a failed step, carried out outside the error's handling
        (its traceback holds the broken world's sockets); again while members die during it."""
        if self.order is None:
            return False
        while self.order is not None:
            try:
                self.recover()
            except Exception as e:
                if self.await_recover(e) is None:
                    raise
        return True

    def adopt(self, live) -> None:
        """A run.loader(): ddptui shards its epoch, takes a point where an epoch starts (none
        is ever behind it), and recovers before handing out the next batch. A rank that joined
        takes its epoch up where the world is."""
        live.set_world(self.me.rank, self.me.world_size)
        resume = self.me.resume
        if resume is not None and len(resume["consumed"]) > len(self.me.loaders):
            live.resume_at = resume["consumed"][len(self.me.loaders)]
        live.on_epoch = self._epoch_start
        live.on_next = self.recover_pending

    def _epoch_start(self) -> None:
        """A point good at once where an epoch starts (one host sync an epoch: its last step is
        done here, not cut short by an abort): survivors of a death in the epoch's first steps
        could otherwise go back only into the last epoch, which your loop cannot redo."""
        if self.cuda:
            torch.cuda.current_stream().synchronize()
        if not self.me.mailbox.has_urgent:
            self.rollback.take(self.me.global_step, self.me.position(), agreed=True)

    # -- world changes ---------------------------------------------------------------------------
    def await_recover(self, error: BaseException) -> dict | None:
        """A step failed: ddptui's recover order when a peer died (kept for the next safe
        point), None when the error is the script's own."""
        self.order = self.me.mailbox.recover_order(error)
        return self.order

    def check_lost(self) -> None:
        """At a step's end: a peer died while this rank's step went through (raised, so that
        the step is redone from the rollback point)."""
        if self.me.mailbox.has_urgent:
            raise WorldLost("a peer died")

    # Each change of the world holds off the mailbox's abort until it is done, as the built-in
    # loop's do (Mailbox.changing: without it a joiner killed as the world formed corrupted a
    # survivor's heap, 3 runs of bench/faults.py on 2 x H200), and raises WorldLost then if a
    # member died meanwhile.
    def reform(self, order: dict) -> None:
        """An agreed leave (s): the members re-form at the same step; the one leaving exits."""
        me = self.me
        leftover = self.orders.finish(agreeing=True)
        with me.mailbox.changing():
            world.dismantle(self._warn, collect=False)
            if me.slot not in order["members"]:
                self.close()
                me.leave(f"left the world at global step {me.global_step}")
            entered = self._enter(order)
            if order.get("joiner") is not None:
                self._share(order, entered[2])
            self._settle(entered, order, leftover)

    def join(self, joining: Joiner) -> None:
        """A standby's script formed the order's world (ddptui.init() set its environment) and
        said it is prepared: the group orders are agreed in, as form() makes it on the members
        once they are told, then the state."""
        order, mailbox = joining.order, self.me.mailbox
        with mailbox.changing():
            group = world.control_group(joining.store, self.me.world_size,
                                        lambda: mailbox.has_urgent)
            if self.cuda:
                world.make_communicator(self.device)
            self._share(order, group)
            self._settle((self.me.rank, self.me.world_size, group), order, [])

    def _share(self, order: dict, group) -> None:
        """The first member that is not the joiner sends the joiner its state and position,
        point to point: what state_fn() returns (the joiner's own has no optimizer state yet),
        the rest in one pickled message over the gloo `group`, then its device tensors in one
        batch over the world's communicator (a plain send/recv pair would make a communicator
        of their own, one more place for a peer's death to leave a rank in NCCL's init)."""
        members, me = order["members"], self.me
        src = members.index(next(s for s in members if s != order["joiner"]))
        dst = members.index(order["joiner"])
        if me.rank not in (src, dst):
            return
        if me.rank == src:
            tensors, skeleton, _ = self.rollback.read()
            meta = {"skeleton": skeleton, "position": me.position(),
                    "specs": [(t.shape, t.dtype, t.device.type) for t in tensors],
                    "host": {i: t for i, t in enumerate(tensors) if not t.is_cuda}}
            dist.send_object_list([meta], dst=dst, group=group)
            _exchange([dist.P2POp(dist.isend, t, dst) for t in tensors if t.is_cuda])
            return
        box: list = [None]
        dist.recv_object_list(box, src=src, group=group)
        meta = box[0]
        tensors = [meta["host"][i] if kind == "cpu" else
                   torch.empty(shape, dtype=dtype, device=self.device)
                   for i, (shape, dtype, kind) in enumerate(meta["specs"])]
        _exchange([dist.P2POp(dist.irecv, t, src) for t in tensors if t.is_cuda])
        self.rollback.load(meta["skeleton"], tensors)
        me.resume = meta["position"]  # for its epochs and run.loader()s
        me.global_step = meta["position"]["global_step"]

    def recover(self) -> None:
        """After a peer died: re-form from the survivors and go back to the newest rollback
        point they all hold; your load function gets that state."""
        me, order = self.me, self.order
        self.order = None
        self.orders.finish(agreeing=False)
        with me.mailbox.changing():
            world.dismantle(self._warn, collect=True)
            entered = self._enter(order)
            summaries: list = [None] * entered[1]
            dist.all_gather_object(summaries, self.rollback.summary(), group=entered[2])
            target = agree(summaries)
            if target is None:
                raise RuntimeError("a rank died and the survivors share no rollback point")
            redone = me.global_step - target
            self._go_back(self.rollback.restore(target))
            self._settle(entered, order, [])
        me.say(f"recovered on {count(me.world_size, 'rank')}: back to global step "
               f"{me.global_step}, {redone} steps to redo", redone=redone,
               global_step=me.global_step)

    def _go_back(self, host: dict) -> None:
        """The run's position at the rollback point: its step and the loaders' places."""
        me = self.me
        if host["epoch"] != me.epoch:
            raise RuntimeError(f"the survivors' newest common rollback point is in epoch "
                               f"{host['epoch']}, before this one")
        me.global_step = host["global_step"]
        for live, consumed in zip(me.loaders, host["consumed"], strict=True):
            live.restore(consumed)
        me.figures.rewind(me.global_step)

    def _enter(self, order: dict):
        """Form the order's world; returns the gloo group that orders are agreed in."""
        rank, size = order["members"].index(self.me.slot), len(order["members"])
        group = world.form_ordered(self.me.mailbox, rank, size, self.device, order["init"],
                                   self.eager)
        return rank, size, group

    def _settle(self, entered: tuple, order: dict, leftover: list[dict]) -> None:
        """What follows a new world: DDP, the agreement group, the loaders' shards, a point."""
        me = self.me
        self.orders.enter_world(*entered)
        self.model.rebuild(in_sync=True)
        me.reporter.emit("rank", state="running", world_rank=me.rank)
        if me.rank == 0:
            me.mailbox.requeue(leftover)
            me.reporter.emit("world", size=me.world_size, ranks=order["members"],
                             generation=order.get("gen"), epoch=me.epoch or 0,
                             step=me.global_step - me.figures.epoch_steps0,
                             global_step=me.global_step)
        self.rollback.take(me.global_step, me.position(), agreed=True)

    def _warn(self, text: str) -> None:
        self.me.say(text, "warning")

    def close(self) -> None:
        self.rollback.close()


def _exchange(ops: list) -> None:
    """Point-to-point operations as one batch, waited for."""
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()


class Guard:
    """run.guard(): a step that a peer's death may break. The error is caught when ddptui says
    a peer died; the survivors recover before the next batch and redo the steps since the
    point they went back to. Any other error goes on up."""

    def __init__(self, elastic: Elastic):
        self.elastic = elastic

    def __enter__(self) -> Guard:
        self.elastic.recover_pending()
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if not isinstance(error, Exception):
            return False
        return self.elastic.await_recover(error) is not None
