"""The dashboard's orders to your script's ranks (pause, checkpoint, stop, input settings, a
leave): agreed so that every rank carries them out at the same step, then carried out.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch.distributed as dist

from ddptui.kit.elastic.control import CONTROL_OFF, Control, every_rank_linked
from ddptui.rankside import RankSide


class Orders:
    """What the orders agreed so far ask of the script (should_stop, should_checkpoint), and the
    group they are agreed in: the world's ranks, or each rank alone where there is no group."""

    def __init__(self, me: RankSide):
        self.me = me
        self.should_stop = False  # q: end the loop (every rank sees it at the same step)
        self.should_checkpoint = False  # c: save now (true for the step after the order)
        self.paused = False
        self.callbacks: list[Callable[[], None]] = []  # run.on_checkpoint()'s
        self.on_reform: Callable[[dict], None] | None = None  # run.elastic()'s agreed leave
        self.control: Control | None = None
        self.off = False  # not every rank reports: no orders are agreed
        self.alone = False

    def take(self) -> None:
        """The orders agreed at this step, carried out."""
        self.apply(self.agreed())

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
                me.reporter.emit("rank", state="running", alone=True)
        if self.alone:  # every step: look before draining (no exception raised per step)
            return me.mailbox.drain() if not me.mailbox.commands.empty() else []
        return self.control.poll()

    def apply(self, cmds: list[dict]) -> None:
        for cmd in cmds:  # called every step: the table is the class's, built once
            handler = self._HANDLERS.get(cmd.get("op"))
            if handler is not None:  # resume outside a pause, or one this version lacks
                handler(self, cmd)

    def _checkpoint(self, cmd: dict) -> None:
        self.should_checkpoint = True
        self.me.say(f"checkpoint asked for at step {self.me.global_step}")
        for fn in self.callbacks:
            fn()

    def _stop(self, cmd: dict) -> None:
        self.should_stop = True
        self.me.say(f"stop asked for: ending the loop at step {self.me.global_step}")

    def _settings(self, cmd: dict) -> None:
        me = self.me
        if not me.loaders:
            return
        for live in me.loaders:
            live.pending.update(cmd["settings"])
        if me.rank == 0:
            first = me.loaders[0]
            me.reporter.emit("settings", settings={**first.settings, **first.pending},
                             epoch=(me.epoch or 0) + 1, status="pending",
                             request=cmd.get("request"))

    def _apply_now(self, cmd: dict) -> None:
        for live in self.me.loaders:
            live.switch = bool(live.pending)

    def applied(self, settings: dict, before: dict | None) -> None:
        """The first loader put new settings in force: at an epoch's start, or mid-epoch with
        `a` (`before` in force until then), which ends the row's part there on every rank."""
        me, f = self.me, self.me.figures
        if before is not None and f.open and me.global_step > f.segment_steps0:
            f.end_segment(me.global_step, True, before, me.world_size, me.taken_wait())
            f.begin_segment(me.global_step)
        if me.rank == 0:
            me.reporter.emit("settings", settings=settings, epoch=me.epoch or 0,
                             step=me.loaders[0].taken if before is not None else 0,
                             status="applied")

    def _pause(self, cmd: dict) -> None:
        """Every rank waits here, at the same step, until resumed (or stopped)."""
        if self.paused:
            return
        me = self.me
        self.paused = True
        if me.rank == 0 or self.alone:  # alone, each rank pauses at a step of its own
            me.reporter.emit("run", status="paused", global_step=me.global_step)
        while self.paused:
            cmds = me.mailbox.drain() if self.alone else self.control.tick_paused()
            if self.alone:
                time.sleep(0.1)
            for cmd in cmds:
                if cmd.get("op") in ("resume", "stop"):
                    self.paused = False
            self.apply([c for c in cmds if c.get("op") not in ("pause", "resume")])
        if me.rank == 0 or self.alone:
            me.reporter.emit("run", status="resumed", global_step=me.global_step)
        me.figures.begin_interval()

    def _reform(self, cmd: dict) -> None:
        if self.on_reform is not None and not self.me.mailbox.void(cmd):
            self.on_reform(cmd)

    _HANDLERS = {"pause": _pause, "checkpoint": _checkpoint, "stop": _stop,
                 "settings": _settings, "apply": _apply_now, "reform": _reform}
