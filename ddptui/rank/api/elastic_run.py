"""run.elastic() for your own script: rollback points of the state your functions return, a rank
that leaves at an agreed step (s), the survivors' recovery after a peer died (k, a crash), and
run.ddp(), the DistributedDataParallel model that is built again over each new world.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptui.contract.protocol import events
from ddptui.contract.protocol.orders import Order, WorldOrder
from ddptui.contract.wording import count
from ddptui.rank.api.joiner import Joiner
from ddptui.rank.api.rankside import RankSide
from ddptui.rank.api.rollback import Rollback
from ddptui.rank.api.steering import Orders
from ddptui.rank.elastic import change, world
from ddptui.rank.elastic.snapshot import WorldLost

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
        self.order: WorldOrder | None = None  # a recover order, carried out at the next safe point
        model.before_forward = self.rollback.before_forward
        orders.on_reform = self.reform

    def start(self, joining: Joiner | None) -> None:
        """Orders that cannot wait reach the points; a standby's script joins its world now."""
        self.me.mailbox.on_urgent = self.rollback.on_urgent
        if self.cuda:  # NCCL's collectives waiting on a dead peer return
            self.me.mailbox.abort = lambda: world.abort(self.warn)
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
        # With a death pending, a step may have been cut short: only a point that nothing
        # trained since (a joiner's, its state just received) moves to the epoch's start.
        if not self.me.mailbox.has_urgent or self.rollback.at(self.me.global_step):
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

    # -- world changes (ddptui/rank/elastic/change.py, the built-in loop's too) -----------------
    def reform(self, order: WorldOrder) -> None:
        """An agreed leave (s): the members re-form at the same step; the one leaving exits."""
        leftover = self.orders.finish(agreeing=True)
        if not change.reform(self, order, leftover):
            self.close()
            self.me.leave(f"left the world at global step {self.me.global_step}")

    def join(self, joining: Joiner) -> None:
        """A standby's script formed the order's world (ddptui.init() set its environment) and
        said it is prepared: the group orders are agreed in, as form() makes it on the members
        once they are told, then the state."""
        def formed():
            group = world.control_group(joining.store, self.me.world_size,
                                        lambda: self.me.mailbox.has_urgent)
            if self.cuda:
                world.make_communicator(self.device)
            return group

        if change.join(self, joining.order, formed):  # a member died once it had the state
            self.await_recover(WorldLost("a peer died as this rank joined"))

    def recover(self) -> None:
        """After a peer died: re-form from the survivors and go back to the newest rollback
        point they all hold; your load function gets that state."""
        order, self.order = self.order, None
        self.orders.finish(agreeing=False)
        redone = change.recover(self, order)
        me = self.me
        me.say(f"recovered on {count(me.world_size, 'rank')}: back to global step "
               f"{me.global_step}, {redone} steps to redo", kind=events.Rollback,
               redone=redone, global_step=me.global_step)

    # -- change.Member ---------------------------------------------------------------------------
    mailbox = property(lambda self: self.me.mailbox)
    slot = property(lambda self: self.me.slot)
    rank = property(lambda self: self.me.rank, lambda self, v: setattr(self.me, "rank", v))
    world_size = property(lambda self: self.me.world_size,
                          lambda self, v: setattr(self.me, "world_size", v))

    def mark(self, phase: str) -> None:
        pass  # the built-in loop's figures of a change's phases

    def warn(self, text: str) -> None:
        self.me.say(text, "warning")

    def state_for_joiner(self) -> tuple[dict, list[torch.Tensor]]:
        """What state_fn() returns (the joiner's own has no optimizer state yet) and where the
        run is."""
        tensors, skeleton, _ = self.rollback.read()
        return {"skeleton": skeleton, "position": self.me.position()}, tensors

    def tensors_to_receive(self, specs: list[tuple]) -> list[torch.Tensor]:
        return [torch.empty(shape, dtype=dtype, device=self.device if kind == "cuda" else "cpu")
                for shape, dtype, kind in specs]

    def load_from_member(self, host: dict, tensors: list[torch.Tensor]) -> None:
        me = self.me
        self.rollback.load(host["skeleton"], tensors)
        me.resume = host["position"]  # for its epochs and run.loader()s
        me.global_step = host["position"]["global_step"]

    def rollback_summary(self) -> dict:
        return self.rollback.summary()

    def roll_back(self, target: int) -> int:
        """The state at the point, and the run's position there: its step, the loaders' places."""
        me = self.me
        redone = me.global_step - target
        host = self.rollback.restore(target)
        if host["epoch"] != me.epoch:
            raise RuntimeError(f"the survivors' newest common rollback point is in epoch "
                               f"{host['epoch']}, before this one")
        me.global_step = host["global_step"]
        for live, consumed in zip(me.loaders, host["consumed"], strict=True):
            live.restore(consumed)
        me.figures.rewind(me.global_step)
        return redone

    def settle(self, group, order: WorldOrder, leftover: list[Order]) -> None:
        """DDP, the agreement group, the loaders' shards, a point."""
        me = self.me
        self.orders.enter_world(me.rank, me.world_size, group)
        self.model.rebuild(in_sync=True)
        me.reporter.emit(events.Rank(rank=me.reporter.rank, state="running", world_rank=me.rank))
        if me.rank == 0:
            me.mailbox.requeue(leftover)
            me.reporter.emit(events.World(
                rank=me.reporter.rank, size=me.world_size, ranks=order.members,
                generation=order.gen, epoch=me.epoch or 0,
                step=me.global_step - me.figures.epoch_steps0, global_step=me.global_step))
        # A joiner not yet in its epochs stands where the member that sent its state stood: a
        # death before its next point rolls it back there, into the epoch the world is in.
        joined = me.resume if me.epoch is None and me.resume is not None else None
        self.rollback.take(me.global_step, joined or me.position(), agreed=True)

    def close(self) -> None:
        self.rollback.close()


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
