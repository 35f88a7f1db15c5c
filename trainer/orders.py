"""The built-in loop's side of the dashboard's orders: a checkpoint is saved at once, and
settings wait in the loop's state for the epoch's end.
"""

from __future__ import annotations

from ddptui.contract.protocol import events
from ddptui.rank.elastic.agreed import AgreedOrders
from ddptui_trainer.checkpoint import save
from ddptui_trainer.parts import Parts


class LoopOrders(AgreedOrders):
    def __init__(self, p: Parts):
        super().__init__(p.me.reporter, p.mailbox)
        self.p = p

    def speaks(self) -> bool:
        return True  # each rank: the dashboard shows each one's exact step while paused

    def global_step(self) -> int:
        return self.p.state.global_step

    def checkpoint(self) -> None:
        save(self.p)

    def settings(self, new: dict, request: str | None) -> None:
        p = self.p
        p.state.pending.update(new)
        if p.me.is_main:
            p.me.reporter.emit(events.Settings(rank=p.me.reporter.rank,
                                               settings={**p.state.settings, **p.state.pending},
                               epoch=p.sampler.epoch + 1, status="pending", request=request))

    def has_pending(self) -> bool:
        return bool(self.p.state.pending)

    def stopping(self) -> None:
        """The loop sees `stop` after this step and says where it stopped."""
