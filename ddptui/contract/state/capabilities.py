"""What a run can do now, decided in one place from what its RunState folds (a script's or the
built-in loop's, what each rank said it takes, its --checkpoint-dir) and what its source is.

The dashboard's dimmed keys and "why not", the run's check of a dashboard's order and the
script's refusal all ask `Capabilities`; a dashboard attached over the socket derives the same
answer from its replicated state, so nothing else travels.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddptui.contract.state.runstate import RunState

# The control a script's ranks must have said they take (ddptui.init, run.loader) before a key
# or an order can act, by the key's action or the order's op.
_TAKES = {"pause": "pause", "resume": "pause", "checkpoint": "checkpoint", "settings": "settings",
          "toggle": "settings", "workers": "settings", "apply": "settings"}
# What each control is called when a script does not take it.
_WHAT = {"pause": "pause", "checkpoint": "checkpoint order", "settings": "input-pipeline settings"}
NO_CONTROL = ("your script takes no {what} from ddptui: call run = ddptui.init() and "
              "run.step(loss) in its loop{loader} (README: Your own script)")
# The keys that steer (a replay or a finished run has none of them).
STEERING = frozenset({"pause", "toggle", "workers", "checkpoint", "apply", "stop_rank",
                      "restart_rank", "kill_rank", "end_job"})
READ_ONLY = "this dashboard may only watch (read-only)"
AFTER_KILL = "the others go on through crash recovery"
LAUNCHED_KILL = ("the script's launcher then does what it does (mp.spawn ends the other ranks and "
                 "fails)")


@dataclass(frozen=True)
class Capabilities:
    """A run's answer to "can this act now, and if not why": see `of` for where each part
    comes from."""

    steer: bool = True  # it takes orders at all (a replay: no)
    read_only: bool = False  # this dashboard may only watch (ddptui web's tab without --control)
    over: bool = False  # nothing can act any more: q quits
    owns_ranks: bool = True  # ddptui started the ranks (an attach: no)
    end_job: bool = False  # K ends a job ddptui attached to
    script: bool = False  # your own script's run (else the built-in loop)
    takes: frozenset[str] = frozenset()  # what a script's ranks said they take
    elastic: bool = False  # every rank of the script gave run.elastic()
    launcher: bool = False  # the script starts its own ranks (mp.spawn, ddp_spawn)
    checkpoint_dir: bool = False  # the built-in loop has somewhere to write a checkpoint

    @classmethod
    def of(cls, state: RunState, *, steer: bool = True, read_only: bool = False,
           over: bool = False, owns_ranks: bool = True, end_job: bool = False) -> Capabilities:
        """From the run state (the caller holds its lock, or owns it) and its source's kind."""
        ranks = [r for r in state.ranks.values() if r.rank >= 0]  # not a script's launcher
        launcher = bool(state.meta.get("launcher"))
        return cls(steer=steer, read_only=read_only, over=over, owns_ranks=owns_ranks, end_job=end_job,
                   script=bool(state.meta.get("script")),
                   takes=frozenset(c for r in ranks for c in r.control),
                   elastic=not launcher and bool(ranks) and all("elastic" in r.control
                                                                for r in ranks),
                   launcher=launcher,
                   checkpoint_dir=bool(state.meta.get("checkpoint_dir")))

    def why_not(self, action: str) -> str | None:
        """Why a key's action or an order's op cannot act now, or None when it can."""
        if action in STEERING and not self.steer:
            return "a replay has nothing to steer"
        if action in STEERING and self.over:
            return "the run is over: q quits"
        if action in STEERING and self.read_only:
            return READ_ONLY
        if action == "end_job" and not self.end_job:
            return "K ends a job ddptui attached to; in a run ddptui owns, q ends it"
        need = _TAKES.get(action)
        if need is None:
            return None
        if self.script and need not in self.takes:
            return NO_CONTROL.format(what=_WHAT[need], loader=", and make its DataLoader with "
                                     "run.loader()" if need == "settings" else "")
        if not self.script and need == "checkpoint" and not self.checkpoint_dir:
            return "no --checkpoint-dir was given"
        return None

    def restarts_group(self, key: str) -> bool:
        """Whether s, r or k (`key`) restarts every rank together: a script's ranks, unless they
        gave run.elastic() (then each acts on one rank); k kills one rank of a script that
        starts its own (its launcher then does what it does)."""
        return self.owns_ranks and self.script and not self.elastic and \
            not (key == "k" and self.launcher)

    @property
    def restarts_as_group(self) -> bool:
        """Whether the run can end every rank and start them again (a script's run: r on a
        failed run, s, r, k without run.elastic())."""
        return self.owns_ranks and self.script

    @property
    def after_kill(self) -> str:
        """What follows k on one rank, as the dashboard says it."""
        return LAUNCHED_KILL if self.launcher else AFTER_KILL
