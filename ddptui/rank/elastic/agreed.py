"""The dashboard's agreed orders as a rank carries them out: one set of handlers for the
built-in loop and your script, dispatched by op. Each order sets what the loop acts on at its
next safe point; a subclass says how its loop checkpoints, where its settings wait, and who
speaks for the world.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from ddptui.contract.protocol import events
from ddptui.contract.protocol.orders import (
    Apply,
    ChangeSettings,
    Order,
    Pause,
    Reform,
    Resume,
    Stop,
    TakeCheckpoint,
)

if TYPE_CHECKING:
    from ddptui.rank.elastic.control import Mailbox
    from ddptui.rank.telemetry.reporter import Reporter


class AgreedOrders(ABC):
    """paused, stop, apply_now (`a`) and reform (an agreed leave or join): the same on every
    rank after the same orders. A pause lasts until a resume, or until the loop must act."""

    def __init__(self, reporter: Reporter, mailbox: Mailbox | None):
        self.reporter, self.mailbox = reporter, mailbox
        self.paused = self.stop = self.apply_now = False
        self.reform: Reform | None = None

    def carry_out(self, cmds: list[Order]) -> None:
        """Every rank calls this with the same orders at the same step."""
        for cmd in cmds:  # an order this version lacks is ignored, on every rank alike
            match cmd:
                case Pause() if not self.paused:
                    self.paused = True
                    self._echo("paused")
                case Resume() if self.paused:
                    self.paused = False
                    self._echo("resumed")
                case Stop():
                    self.stop = True
                    self.stopping()
                case TakeCheckpoint():
                    self.checkpoint()
                case ChangeSettings():
                    self.settings(cmd.settings, cmd.request)
                case Apply() if self.has_pending():
                    self.apply_now = True
                case Reform() if self.mailbox is not None and not self.mailbox.void(cmd):
                    self.reform = cmd

    @property
    def interrupted(self) -> bool:
        """The loop must act now: a stop, settings to apply, or a world change."""
        return self.stop or self.apply_now or self.reform is not None

    def _echo(self, status: str) -> None:
        if self.speaks():
            self.reporter.emit(events.Run(rank=self.reporter.rank,
                                          status=status, global_step=self.global_step()))

    @abstractmethod
    def speaks(self) -> bool:
        """This rank echoes a pause and a resume."""

    @abstractmethod
    def global_step(self) -> int: ...

    @abstractmethod
    def checkpoint(self) -> None:
        """c: save now (the built-in loop), or tell the script to."""

    @abstractmethod
    def settings(self, new: dict, request: str | None) -> None:
        """New input-pipeline settings wait for the next epoch (or `a`); rank 0 echoes them."""

    @abstractmethod
    def has_pending(self) -> bool:
        """Settings wait that `a` can put in force now."""

    @abstractmethod
    def stopping(self) -> None:
        """The loop ends at this step."""
