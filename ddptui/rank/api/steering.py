"""The dashboard's orders to your script's ranks (pause, checkpoint, stop, input settings, a
leave): agreed so that every rank carries them out at the same step, then carried out by the
kit's one set of handlers, as the built-in loop's are.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from ddptui.contract.protocol import events
from ddptui.rank.api.rankside import RankSide
from ddptui.rank.elastic.agreed import AgreedOrders
from ddptui.rank.elastic.control import CONTROL_OFF, Control, every_rank_linked


class Orders(AgreedOrders):
    """What the orders agreed so far ask of the script (should_checkpoint, stop), and the
    group they are agreed in: the world's ranks, or each rank alone where there is no group.
    Your script has no loop of ddptui's to act at a safe point: take() acts at once, and a
    pause holds the step until it ends."""

    def __init__(self, me: RankSide):
        super().__init__(me.reporter, me.mailbox)
        self.me = me
        self.should_checkpoint = False  # c: save now (true for the step after the order)
        self.callbacks: list[Callable[[], None]] = []  # run.on_checkpoint()'s
        self.on_reform: Callable[[dict], None] | None = None  # run.elastic()'s agreed leave
        self.control: Control | None = None
        self.off = False  # not every rank reports: no orders are agreed
        self.alone = False

    def take(self) -> None:
        """The orders agreed at this step, carried out; a pause holds here, at the same step
        on every rank, until resumed (or stopped)."""
        self.carry_out(self.agreed())
        self._act()
        if not self.paused:
            return
        while self.paused and not self.stop:
            cmds = self.me.mailbox.drain() if self.alone else self.control.tick_paused()
            if self.alone:
                time.sleep(0.1)
            self.carry_out(cmds)
            self._act()
        self.me.figures.begin_interval()

    def _act(self) -> None:
        """What the loop would do at its safe point: settings in force now (`a`), a leave."""
        if self.apply_now:
            self.apply_now = False
            for live in self.me.loaders:
                live.switch = bool(live.pending)
        if self.reform is not None:
            order, self.reform = self.reform, None
            if self.on_reform is not None:
                self.on_reform(order)

    def enter_world(self, rank: int, world_size: int, group) -> None:
        """run.elastic(): the rank's place in a new world, and the group orders are agreed in."""
        me = self.me
        me.rank, me.world_size = rank, world_size
        self.control, self.alone = Control(me.mailbox, rank, group), False
        self.off = False  # every member of a world ddptui formed reports
        for live in me.loaders:
            live.set_world(rank, world_size)

    def finish(self, agreeing: bool) -> list[dict]:
        """The world is changing: the group goes; `agreeing`, orders in flight in it come back."""
        leftover = self.control.finish() if agreeing and self.control is not None else []
        self.control = None
        return leftover

    def agreed(self) -> list[dict]:
        """The dashboard's orders, the same on every rank at the same step."""
        if self.off:
            return []
        me = self.me
        if self.control is None:
            group = None
            if me.world_size > 1 and dist.is_available() and dist.is_initialized():
                linked = every_rank_linked(me.world_size, lambda: me.mailbox.has_urgent)
                if not linked:  # None: a peer died; the recovery's world brings the control
                    self.off = linked is not None
                    if self.off:
                        me.say(CONTROL_OFF, "warning")
                    return []
                # A gloo group of our own: a few bytes every ~50 ms, never on the script's
                # NCCL streams. Created at the first step, which every rank reaches.
                group = dist.new_group(backend="gloo")
            self.control = Control(me.mailbox, me.rank, group)
            self.alone = group is None
            if self.alone and me.world_size > 1:  # no group to agree through: send us each
                me.reporter.emit(events.Rank(rank=me.reporter.rank, state="running", alone=True))
        if self.alone:  # every step: look before draining (no exception raised per step)
            return me.mailbox.drain() if not me.mailbox.commands.empty() else []
        return self.control.poll()

    # -- the kit's handlers, for a script ----------------------------------------------------
    def speaks(self) -> bool:
        return self.me.rank == 0 or self.alone  # alone, each rank pauses at a step of its own

    def global_step(self) -> int:
        return self.me.global_step

    def checkpoint(self) -> None:
        self.should_checkpoint = True
        self.me.say(f"checkpoint asked for at step {self.me.global_step}")
        for fn in self.callbacks:
            fn()

    def stopping(self) -> None:
        self.me.say(f"stop asked for: ending the loop at step {self.me.global_step}")

    def settings(self, new: dict, request: str | None) -> None:
        me = self.me
        for live in me.loaders:
            live.pending.update(new)
        if me.rank == 0 and me.loaders:
            first = me.loaders[0]
            me.reporter.emit(events.Settings(rank=me.reporter.rank,
                                             settings={**first.settings, **first.pending},
                             epoch=(me.epoch or 0) + 1, status="pending", request=request))

    def has_pending(self) -> bool:
        return any(live.pending for live in self.me.loaders)

    def applied(self, settings: dict, before: dict | None) -> None:
        """The first loader put new settings in force: at an epoch's start, or mid-epoch with
        `a` (`before` in force until then), which ends the row's part there on every rank."""
        me, f = self.me, self.me.figures
        if before is not None and f.open and me.global_step > f.segment_steps0:
            f.end_segment(me.global_step, True, before, me.world_size, me.taken_wait())
            f.begin_segment(me.global_step)
        if me.rank == 0:
            me.reporter.emit(events.Settings(rank=me.reporter.rank, settings=settings, epoch=me.epoch or 0,
                             step=me.loaders[0].taken if before is not None else 0,
                             status="applied"))
