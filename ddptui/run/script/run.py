"""A script's run: the thread that owns its ranks' processes (RankGroup), folds what they print
and report into the run state and the log (ScriptWatch), ends them on q, Ctrl-C or SIGTERM the
way torchrun does, and restarts the whole group after a failure or on request; under
run.elastic() one rank leaves, dies or joins while the others go on (ScriptWorld).
"""

from __future__ import annotations

import os
import queue
import secrets
import signal
import time

from ddptui.contract.listener import ReportListener
from ddptui.contract.observe.endings import crash_cause
from ddptui.contract.observe.flight import trace_prefix
from ddptui.contract.options.script import ScriptConfig
from ddptui.contract.protocol import orders
from ddptui.contract.protocol.events import PARENT, Clock, Error, Event, Notice, Rank, Run, World
from ddptui.contract.runs.registry import default_log_path
from ddptui.contract.state.runstate import RunState
from ddptui.contract.states import RankState
from ddptui.contract.tensorboard import TensorBoardSink
from ddptui.contract.wording import count
from ddptui.run.outcome import EXIT_FAILED, EXIT_INTERRUPTED, Outcome
from ddptui.run.owned import OwnedRun
from ddptui.run.ports import free_port
from ddptui.run.readings import SAMPLE_EVERY_S, RunSampler
from ddptui.run.script.group import HUNG_GRACE_S, LAUNCHER, RankGroup, ScriptRank
from ddptui.run.script.launch import Attempt, described, new_run_id
from ddptui.run.script.launched import LaunchedRanks
from ddptui.run.script.roster import ScriptWorld
from ddptui.run.script.watch import ScriptWatch


class ScriptRun(LaunchedRanks, OwnedRun):
    """The run source for a script: start(), steer, stop(); done and exit_code as a Supervisor."""

    _restarted_why = "restarted on request"  # or: started again as its ranks' launcher

    def __init__(self, config: ScriptConfig, log_path: str | None = None):
        log_path = log_path or config.log or default_log_path()
        self.meta = {"model": config.label, "script": described(config),
                     "data": "", "epochs": 0, "world_size": config.world_size,
                     "device_kind": config.device_kind, "gpus": list(config.gpus or []),
                     "log": log_path, "launcher": config.launch or None}
        super().__init__(log_path, RunState(dict(self.meta)), self._main, "script-run", own={
            orders.Stop: self._stop, orders.AskStacks: self._ask_stacks,
            orders.RestartGroup: self._restart_group, orders.StopRank: self._stop_rank,
            orders.KillRank: self._kill_rank, orders.RestartRank: self._restart_rank})
        self.config = config
        self.stem = os.path.splitext(self.log_path)[0]
        self.world = ScriptWorld([])  # who is in it (run.elastic: s and k act on one rank)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # events and lines from threads
        self._key = secrets.token_hex(16)
        self._link = ReportListener(("127.0.0.1", 0), self._key.encode(), self._inbox.put,
                                    lambda level, text: self._inbox.put(
                                        Notice(rank=PARENT, level=level, text=text)))
        self.door = self._door(self._inbox.put)
        self.watch = ScriptWatch(config, self._handle, self.say, trace_prefix(self.stem))
        self.group: RankGroup | None = None
        self._tensorboard: TensorBoardSink | None = None  # --tensorboard: every rank's scalars
        self.run_id = new_run_id()
        self.attempts = self.failures = 0  # group starts; failures --max-restarts counts
        self._restart: bool = False  # start the group again once every rank has ended
        self._ended = False  # the current attempt's `run` outcome was emitted
        self._unneeded: set[int] = set()  # standbys and joiners ended as the others finished
        # A failed run waits for r or q while a dashboard shows it (in the run's own process:
        # while one is attached; with none, nobody is there to press r).
        self.watched = lambda: not config.headless

    # -- the calls the dashboard and the signal handlers make (queued for the thread) ----------
    def restart_group(self, kill: int | None = None) -> None:
        """Every rank ends (SIGTERM, `kill` at once) and the group starts again."""
        self._commands.put(orders.RestartGroup(kill=kill))

    @property
    def controls(self) -> set[str]:
        """What the ranks opted into (ddptui.init, run.loader, run.elastic)."""
        return self.world.opted

    def pids(self) -> set[int]:
        return self.group.pids() if self.group else set()

    def _order(self, cmd: orders.Order, note: Event | None = None) -> None:
        # Straight to the ranks' leader (the link is thread-safe); with no rank that opted in to
        # the control, nothing was asked.
        if self._link.order(cmd) and note is not None:
            self.state.apply(note)

    _send = _order  # what the run does not carry out itself goes to the ranks

    # -- the thread ----------------------------------------------------------------------------
    def _handle(self, ev: Event) -> None:
        self.state.apply(ev)
        self._log(ev)
        if self._tensorboard is not None:
            self._tensorboard.put(ev)

    def _main(self) -> None:
        try:
            self.sampler = RunSampler(self.config.gpus, self._handle,
                                      lambda text: self.say(text, "warning"))
            self._link.start()
            if self.config.tensorboard:
                self._tensorboard = TensorBoardSink(self.config.tensorboard, ".ddptui")
            self.group = RankGroup(self.config, self.stem, self.config.headless, self._line)
            self._start_attempt()
            self._loop()
            if not self._ended:
                self._end_attempt()
        except Exception as e:  # a bug of ours: still end every process and say why
            self.exit_code = EXIT_FAILED
            self._handle(Run(rank=PARENT, status="failed", exit_code=EXIT_FAILED,
                               reason=f"ddptui error: {type(e).__name__}: {e}"))
            raise
        finally:
            try:
                if self.group is not None:
                    self.group.end(None, 0)
                    if self.watch.flight is not None:
                        self.watch.flight.remove_pipes(r.slot for r in self.group.ranks)
                self._drain(0)
                self.watch.flush_lines(time.time(), force=True)
            finally:
                self._link.close()
                self.door.close()
                if self._tensorboard is not None:
                    self._tensorboard.close()
                self._closed()

    def _start_attempt(self) -> None:
        attempt = Attempt(self.run_id, self.attempts, free_port(),
                          f"{self._link.address[0]}:{self._link.address[1]}", self._key)
        self.attempts += 1
        self.outcome, self._ended, self._restart = Outcome(), False, False
        self._link.drop_held()  # told a world that is gone (its generations count again)
        self.world = ScriptWorld([] if self.config.launch else list(range(self.config.world_size)))
        self._link.leader = 0
        self._handle(Run(rank=PARENT, status="started", pid=os.getpid(),
                           restart=attempt.restart, **self.meta))
        n = self.config.world_size
        self.say(self.config.launch or f"starting {count(n, 'rank')}: {described(self.config)}"
                 + (f" (restart {attempt.restart})" if attempt.restart else ""))
        self.group.start(attempt, self.door.path)
        self._attempt = attempt
        if self._launched():  # its ranks are shown as they join a process group
            return
        self.watch.attempt([r.slot for r in self.group.ranks], time.time())
        for r in self.group.ranks:
            self._handle(Rank(rank=r.slot, state=RankState.STARTING, pid=r.pid, gpu=r.gpu,
                               device=f"GPU {r.gpu}" if r.gpu is not None else "cpu"))
        self._handle(World(rank=PARENT, size=n, ranks=list(range(n)), generation=0))

    def _line(self, slot: int, text: str, final: bool) -> None:
        """From the readers' threads."""
        self._inbox.put(("line", slot, text, final))

    def _loop(self) -> None:
        next_sample = 0.0
        while True:
            self._drain(0.1)
            self._run_commands()
            for r in sorted(self.group.ended(), key=self._blame_first):
                self._rank_ended(r)
            now = time.time()
            if now >= next_sample:
                next_sample = now + SAMPLE_EVERY_S
                self._sample(now)
            self.watch.collect_stacks({r.slot: r for r in self.group.alive()}, now)
            self.watch.flush_lines(now)
            self.group.escalate(self.say)
            alive = self.group.alive()
            if alive and all(self._outside(r) for r in alive):
                for r in alive:  # nothing is left for them to join: ended with the run, quietly
                    self._unneeded.add(r.pid)
                    self._link.ending(r.pid)
                    r.kill()
                continue
            if alive:
                continue
            for r in self.group.ended():  # those that ended since the top of this turn
                self._rank_ended(r)
            if not self._ended:
                self._end_attempt()
            if self._restart and self.outcome.stop is None:
                self._start_attempt()
            elif self.outcome.stop is not None or self.outcome.failure is None or \
                    not self.watched():
                return
            # A failed run stays on screen: r starts it again, q leaves.

    def _drain(self, timeout: float) -> None:
        try:
            item = self._inbox.get(timeout=timeout) if timeout else self._inbox.get_nowait()
            while True:
                self._take(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _take(self, item) -> None:
        now = time.time()
        if isinstance(item, tuple):  # a line of a rank's output, or of a launcher or its door
            match item:
                case ("line", slot, text, final) if slot != LAUNCHER:
                    self.watch.line(slot, text, final, now)
                case _:
                    self._from_launcher(item, now)
            return
        if isinstance(item, Clock):  # for attach's watch: this run's ranks share its clock
            return
        self.watch.reported(item, now)
        actions = self.world.reported(item)
        self._link.leader = self.world.leader
        if isinstance(item, Rank) and item.state == "standby":  # shown as why it is out
            state, reason = self.world.out_state(item.rank)
            item = item.replace(state=state, reason=reason, standby="ready")
        self._handle(item)
        self._act(actions)

    def _sample(self, now: float) -> None:
        self.group.scan_children()
        alive = self.group.alive()
        self.sampler.sample({r.slot: (r.pid, r.gpu) for r in alive if r.slot != LAUNCHER},
                            self.group.pids())
        self.sampler.forget()
        self.state.set_host(self.sampler.host())
        # A standby waits for its join order on purpose, a joiner prepares as long as its
        # script takes: no stall verdict, no readings.
        members = [r for r in alive if not self._outside(r) and r.slot != LAUNCHER]
        self.watch.sample(members, self.sampler.util, self.sampler.gpu_memory, now,
                          judge=not self._ending, settings=self.state.settings,
                          gpus_of=self.sampler.gpus_of)

    def _outside(self, r: ScriptRank) -> bool:
        """A standby, or a joiner that the members are not forming a world with yet."""
        return self.world.is_standby(r.slot, r.pid) or self.world.preparing(r.slot)

    # -- ranks ending, the outcome -------------------------------------------------------------
    def _rank_ended(self, r: ScriptRank) -> None:
        code = r.popen.returncode
        if r.slot == LAUNCHER:
            self._launcher_ended(r)
            return
        self.watch.phases(r)
        self.watch.finished(r.slot, code == 0, r.pid)
        if r.pid in self._unneeded:  # a standby or a joiner the run's end made pointless
            if self.world.standing_by.pop(r.slot, None) != r.pid:  # a joiner, shown coming:
                state, reason = self.world.out_state(r.slot)  # the slot is as before r
                self._handle(Rank(rank=r.slot, state=state, reason=reason, pid=r.pid))
        elif self.world.is_standby(r.slot, r.pid):  # it never joined: the slot stays out
            del self.world.standing_by[r.slot]
            if not self._ending and code != -signal.SIGKILL:
                self.say(f"the standby for rank {r.slot} {r.death()}; r starts another",
                         "warning")
        elif code == 0 and r.pid in self.world.left:
            self._rank_state(r, RankState.STOPPED, "left the world on request")
        elif code == 0:
            self._rank_state(r, RankState.DONE, "")
        elif self._ending:  # a stop, a restart, another rank's failure
            self._rank_state(r, RankState.STOPPED, self._ended_by(r))
        else:
            lines = r.traceback()
            text = crash_cause(code, lines)
            self._rank_state(r, RankState.CRASHED, text)
            if self._failed_rank is None:
                self._failed_rank = r.slot
            if r.pid in self.world.killed:  # killed by ddptui: k, or a world that broke
                text = self.world.killed[r.pid]
            self._handle(Error(rank=r.slot, text=text, traceback=lines,
                               exit_code=r.exit_code, pid=r.pid))
            self._copies_failed(text)
            if self.outcome.failure is None:
                alive = {a.slot for a in self.group.alive()}
                self._act(self.world.died(r.slot, alive, r.ended_with(text), r.exit_code))

    def _tell(self, slot: int, order: orders.Order) -> None:
        self._link.tell(slot, order)

    def _joining(self, slot: int) -> None:
        self.world.standing_by.pop(slot, None)

    def _standby(self, slot: int) -> None:
        """Only for a rank that r asked back."""
        if not self.world.wants_standby(slot):
            return
        r = self.group.start_one(slot, self._attempt, standby=True)
        self.world.standing_by[slot] = r.pid
        self.watch.attempt([slot], time.time(), standby=True)
        state, reason = self.world.out_state(slot)
        self._handle(Rank(rank=slot, state=state, reason=reason, pid=r.pid,
                           standby="warming"))

    def _kill(self, slot: int, why: str) -> None:
        for r in self.group.alive():
            if r.slot == slot:
                self.world.killed[r.pid] = why
                r.kill()

    @property
    def _ending(self) -> bool:
        """The group is being ended: by a stop, a restart, or after a rank failed."""
        return self._restart or self.outcome.ending

    def _fail(self, code: int, reason: str) -> None:
        """The first failure: the others are ended as torchrun ends them, and the group
        restarts while --max-restarts allows."""
        if not self.outcome.fail(code, reason):
            return
        if self.failures < self.config.max_restarts:
            self.failures += 1
            self._restart = True
            self.say(f"{reason}: restarting every rank ({self.failures} of "
                     f"--max-restarts {self.config.max_restarts})", "warning")
        self._end_within(self._failure_signal())

    def _end_within(self, sig: int | None) -> None:
        """End the group as torchrun does (`sig` now, SIGKILL after --grace), but the ranks
        flagged stalled or waiting, which cannot end by themselves, after HUNG_GRACE_S."""
        self.group.end_within(sig, self.config.grace, set(self.watch.flags))

    def _rank_state(self, r: ScriptRank, state: str, reason: str) -> None:
        self._handle(Rank(rank=r.slot, state=state, pid=r.pid, gpu=r.gpu, reason=reason,
                           exit_code=r.exit_code))

    def _end_attempt(self) -> None:
        """The `run` event for the attempt that ended: done, failed or interrupted."""
        self._ended = True
        if self._restart and not self.outcome.ending:
            status, code, reason = "interrupted", EXIT_INTERRUPTED, self._restarted_why
        else:
            status, code, reason = self.outcome.result(all_done=True)
        self.exit_code = code
        started = self.state.started_t or time.time()
        self._handle(Run(rank=PARENT, status=status, exit_code=code, reason=reason,
                           seconds=round(time.time() - started, 2),
                           restarting=self._restart and self.outcome.stop is None))

    def _end_now(self) -> None:
        self.group.end(None, 0)

    def _ask_stacks(self, cmd: orders.AskStacks) -> None:
        live = {r.slot: r for r in self.group.alive()}
        if cmd.rank in live:
            self.watch.ask_stacks(live[cmd.rank], time.time())
        else:
            self.say(f"rank {cmd.rank} has no live process to ask for its stacks", "warning")

    def _restart_group(self, cmd: orders.RestartGroup) -> None:
        if self.outcome.stop is not None:
            return
        self._restart, self._restarted_why = True, "restarted on request"
        self.say("restarting every rank" + ("" if self.group.alive() else " now"))
        for r in self.group.alive():
            if r.slot == cmd.kill:
                r.kill()
        self._end_within(signal.SIGTERM)

    def _restart_rank(self, cmd: orders.RestartRank) -> None:
        if self.outcome.stop is None:
            self._act(self.world.restart(cmd.rank))

    def _stop_rank(self, cmd: orders.StopRank) -> None:
        if self.outcome.stop is None:
            self._act(self.world.stop(cmd.rank))

    def _kill_rank(self, cmd: orders.KillRank) -> None:
        one = self.world.elastic and self.world.is_member(cmd.rank) or self.config.launch
        if one and self.outcome.stop is None:
            self._kill(cmd.rank, "killed with k")

    def _wind_down(self, code: int) -> None:
        if not self.group.alive():
            return
        hung = set(self.watch.flags)
        then = f"SIGKILL after {self.config.grace:g} s" + (
            f" ({count(len(hung), 'hung rank')} after {min(HUNG_GRACE_S, self.config.grace):g} s)"
            if hung else "")
        if "stop" in self.controls and self._link.order(orders.Stop()):
            self.say("stopping: every rank ends its loop at the same step (run.should_stop); "
                     + then)
            self._end_within(None)
            return
        sig = signal.SIGINT if code == EXIT_INTERRUPTED else signal.SIGTERM
        self.say(f"stopping: {signal.Signals(sig).name} to every rank, {then}")
        self._end_within(sig)

