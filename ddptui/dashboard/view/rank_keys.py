"""s, r, k and K: a rank taken out, brought back or killed, or the whole job ended, as far as the
run on screen allows; where a key cannot act, a notification says why; / goes to a rank by its
number. Part of DashboardApp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddptui.contract.state.source import RunSource
from ddptui.contract.state.views import RankView, RunView
from ddptui.dashboard.view.screens.confirm import ConfirmEndJob, ConfirmRestart
from ddptui.dashboard.view.screens.jump import JumpToRank


class RankKeys:
    """The rank keys' actions, for DashboardApp: what they take of the app, declared."""

    source: RunSource
    view: RunView | None
    selected_rank: int
    notify: Callable[..., None]  # App.notify
    push_screen: Callable[..., Any]  # App.push_screen
    _can_steer: Callable[..., bool]
    _ranks: Callable[[], list[RankView]]
    _selected: Callable[[], RankView | None]

    def _whole_group(self, key: str) -> bool:
        """s, r, k on a script's run: its ranks restart together (asked first while they run)."""
        if not self.source.capabilities.restarts_group(key):
            return False
        rank = self.selected_rank
        if not any(r.state.is_member or r.state.is_coming for r in self._ranks()):
            self.source.restart_group()  # nothing runs (it failed): r starts it again
            self.notify("starting every rank again")
            return True

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.source.restart_group(kill=rank if key == "k" else None)
                self.notify("restarting every rank")

        self.push_screen(ConfirmRestart(rank, key), confirmed)
        return True

    def action_stop_rank(self) -> None:
        if not self._can_steer() or self._whole_group("s"):
            return
        if not self.source.owns_ranks:  # attach: it says who to ask instead
            self.source.stop_rank(self.selected_rank)
            return
        rank = self._selected()
        members = [r.rank for r in self.view.ranks if r.state.is_member]
        stepping = [r.rank for r in self.view.ranks if r.state.is_stepping]  # running or slow
        if rank is None or rank.rank not in members:
            self.notify(f"rank {self.selected_rank} is not running", severity="warning")
        elif not rank.state.is_stepping:  # it would leave at an agreed step, which it can't reach
            self.notify(f"rank {rank.rank} is {rank.state}: it cannot reach the step where it "
                        "would leave; k kills it", severity="warning")
        elif stepping == [rank.rank]:
            self.notify("that is the last running rank: q ends the run", severity="warning")
        else:
            self.source.stop_rank(rank.rank)
            self.notify(f"rank {rank.rank} leaves at the next agreed step")

    def action_restart_rank(self) -> None:
        if not self._can_steer() or self._whole_group("r"):
            return
        if not self.source.owns_ranks:
            self.source.restart_rank(self.selected_rank)
            return
        rank = self._selected()
        if rank is None or rank.state.is_coming:
            self.notify(f"rank {self.selected_rank} is already on its way", severity="warning")
            return
        self.source.restart_rank(rank.rank)
        if rank.state.can_rejoin:  # queued until its standby is warm
            self.notify(f"rank {rank.rank} joins again now" if rank.standby == "ready" else
                        f"rank {rank.rank} joins again as soon as its standby is warm")
        else:
            self.notify(f"rank {rank.rank} leaves and joins again")

    def action_kill_rank(self) -> None:
        if not self._can_steer() or self._whole_group("k"):
            return
        if not self.source.owns_ranks:  # attach: through the rank's wrapper, or it says why
            self.source.kill_rank(self.selected_rank)
            return
        rank = self._selected()
        if rank is None or not rank.state.is_member:
            self.notify(f"rank {self.selected_rank} is not in the world", severity="warning")
            return
        self.source.kill_rank(rank.rank)
        self.notify(f"killing rank {rank.rank}: {self.source.capabilities.after_kill}")

    def action_end_job(self) -> None:
        def confirmed(yes: bool | None) -> None:
            if yes:
                self.source.end_job()

        self.push_screen(ConfirmEndJob(self.source.grace), confirmed)

    def action_jump(self) -> None:
        ranks = [r.rank for r in self._ranks()]
        if not ranks:
            return

        def chosen(rank: int | None) -> None:
            if rank is not None:
                self.selected_rank = rank

        self.push_screen(JumpToRank(ranks), chosen)

    def _selected(self):
        return next((r for r in self._ranks() if r.rank == self.selected_rank), None)

    def _ranks(self) -> list[RankView]:
        return self.view.ranks if self.view else []
