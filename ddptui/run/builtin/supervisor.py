"""The supervisor: one thread that owns every rank process (through the ProcessPool), folds their
telemetry into the run state and the log, watches their health, and decides and acts.

It decides who is in the world: it orders leaves and joins (agreed by the ranks at a step),
recoveries when a rank dies (sent straight to the survivors), and keeps a warm standby process
for every rank that is out of the world, ready to join.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import wait as wait_any

from ddptui.contract.options.config import RunConfig
from ddptui.contract.options.policy import RunPolicy
from ddptui.contract.protocol.events import PARENT, Beat, Event, Gpu, Notice, Rank, Run, Settings, Step, World
from ddptui.contract.protocol.orders import (
    AskStacks,
    KillRank,
    Order,
    Recover,
    Reform,
    RestartRank,
    Stop,
    StopRank,
)
from ddptui.contract.protocol.steptime import Phases
from ddptui.contract.runs.registry import default_log_path
from ddptui.contract.state.runstate import RunState
from ddptui.contract.states import RankState
from ddptui.contract.wording import count
from ddptui.run.builtin.dataset import prepare_data
from ddptui.run.builtin.processes import ProcessPool, RankProcess
from ddptui.run.builtin.watchdog import Member, Watchdog
from ddptui.run.inputwatch import Pipeline
from ddptui.run.membership import Membership
from ddptui.run.outcome import EXIT_FAILED, EXIT_USAGE
from ddptui.run.owned import OwnedRun
from ddptui.run.ports import free_port
from ddptui.run.readings import SAMPLE_EVERY_S, RunSampler

STOP_GRACE_S = 20.0  # agreed stop, final checkpoint and exit; then SIGTERM
STALLED_STOP_S = 5.0  # a stop past a stalled rank: the others roll back, checkpoint, exit


class Supervisor(OwnedRun):
    """Start with start(); steer with the OwnedRun calls, which queue a command for its thread;
    wait() returns the exit code. Only this class (through its ProcessPool) starts or kills
    processes."""

    def __init__(self, config: RunConfig, log_path: str | None = None,
                 policy: RunPolicy | None = None):
        log_path = log_path or config.telemetry.log or default_log_path()
        # The supervisor's own commands; the rest go to the world's rank 0.
        super().__init__(log_path, RunState({
            "model": config.model.name, "data": config.data.spec, "epochs": config.train.epochs,
            "world_size": config.devices.world_size, "device_kind": config.devices.kind,
            "gpus": list(config.devices.gpus or []), "batch_size": config.train.batch_size,
            "log": log_path, "checkpoint_dir": config.checkpoint.dir,
        }), self._main, "supervisor", own={
            Stop: self._stop, StopRank: self._change_world, RestartRank: self._change_world,
            KillRank: self._kill_asked, AskStacks: self._ask_stacks})
        self.config, self.policy = config, policy or RunPolicy()
        self.pool = ProcessPool(config, self.log_path)
        self.world = Membership([], lambda: f"tcp://127.0.0.1:{free_port()}")
        self._restarts = 0
        self._autotuner = None
        self._stop_deadline: float | None = None
        self.watchdog = Watchdog(self.policy.stall_after, self.policy.on_stall == "recover",
                                 config.telemetry.hz > 0, self._process_of, self._pipeline)

    @property
    def slots(self) -> dict[int, RankProcess]:
        """Each rank slot's current process."""
        return self.pool.slots

    @property
    def members(self) -> list[int]:
        """The slots in the world (the one being formed, while a change is unconfirmed)."""
        return self.world.members

    def pids(self) -> set[int]:
        """Every process of the run seen so far: ranks and their workers."""
        return self.pool.pids()

    # -- events --------------------------------------------------------------------------------
    def _handle(self, ev: Event) -> None:
        """Every event, ours or a rank's, goes through here: state, log, then decisions."""
        if isinstance(ev, (Step, Beat, Gpu, Phases)):
            self.watchdog.observe(ev)
            if isinstance(ev, Beat):  # for the watchdog only: the log keeps what it concluded
                return
        self.state.apply(ev)
        self._log(ev)
        match ev:
            case Notice() if (why := self.outcome.message(ev)):
                self.stop("failed", EXIT_USAGE, why)
            case World(generation=int(gen)) if gen and ev.rank != PARENT:
                if not self.world.idle() and gen == self.world.change.gen:
                    self.watchdog.restart_clock(self.members, ev.t)
                self._act(self.world.world_confirmed(gen, time.time()))
                self._act(self.world.ask_again(self.state.unanswered()))
            case Run(status="resumed"):
                self.watchdog.restart_clock(self.members, ev.t)
            case Settings(status="applied"):
                self.watchdog.restart_clock(self.members, ev.t, first_step=True)

    def _from_rank(self, ev: Event) -> None:
        """A rank's own event: its state moves the slot's process on; while the slot is out of
        the world, its standby's states are shown as a detail of why it is out."""
        slot = ev.rank
        if isinstance(ev, Notice) and self.outcome.known_bad(ev):
            return  # another rank met it too: each file is named once in the run
        if isinstance(ev, Rank) and slot in self.slots:
            rp = self.slots[slot]
            if ev.state == RankState.RUNNING and not rp.state.is_final:
                rp.state = RankState.RUNNING
                self.world.entered(slot)
                self.watchdog.restart_clock([slot], ev.t)
            elif ev.state == RankState.STANDBY and rp.state == RankState.STARTING:
                rp.state = RankState.STANDBY
                self._handle(self._as_out(ev, "ready"))
                if self._running():
                    self._act(self.world.standby_ready(slot, time.time()))
                return
        self._handle(ev)

    def _as_out(self, ev: Rank, standby: str) -> Rank:
        out = self.world.out.get(ev.rank)
        if out is None:
            return ev.replace(standby=standby)
        return ev.replace(state=out[0], reason=out[1], standby=standby)

    def _flag(self, slot: int, state: str, reason: str, fields: dict) -> None:
        rp = self.slots[slot]
        self._handle(Rank(rank=slot, state=state, pid=rp.process.pid, gpu=rp.gpu, reason=reason,
                          **fields))

    # -- the thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        code = EXIT_FAILED
        try:
            self.sampler = RunSampler(self.config.devices.gpus, self._handle,
                                      lambda text: self.say(text, "warning"))
            self._handle(Run(rank=PARENT, status="started", pid=os.getpid(), **self.state.meta))
            prepare_data(self.config, self.say)
            if self.outcome.stop is None:
                self._spawn()
                self._loop()
            done = bool(self.members) and all(self.slots[s].state == RankState.DONE
                                              for s in self.members)
            status, code, reason = self.outcome.result(done)
            self._handle(Run(rank=PARENT, status=status, exit_code=code, reason=reason,
                             seconds=round(time.time() - (self.state.started_t or time.time()), 2),
                             best_val_acc=self.state.best_val_acc))
        except Exception as e:  # a bug of ours: still end every process and say why
            self._handle(Run(rank=PARENT, status="failed", exit_code=EXIT_FAILED,
                             reason=f"supervisor error: {type(e).__name__}: {e}"))
            raise
        finally:
            try:
                self._end_now()
                self.pool.drain(self._from_rank)
            finally:
                self.exit_code = code if self.exit_code is None else self.exit_code
                self.pool.close()
                self._closed()

    def _spawn(self) -> None:
        world = self.config.devices.world_size
        init = f"tcp://127.0.0.1:{free_port()}"
        gpus = list(self.config.devices.gpus) if self.config.devices.gpus else [None] * world
        if self.config.devices.strategy == "dp":  # one process holds every GPU
            gpus = gpus[:1]
        self.say(f"starting {count(world, 'rank')}")
        for slot, gpu in enumerate(gpus):
            self._start_process(slot, gpu, init, standby=False)
        self.world = Membership(list(range(world)), self.world.new_address)
        self._handle(World(rank=PARENT, size=world, ranks=list(self.members), generation=0))
        self.watchdog.restart_clock(self.members, time.time())
        if self.policy.autotune:
            from ddptui.run.builtin.autotune import Autotuner, candidates

            self._autotuner = Autotuner(self, candidates(
                self.config.settings(world), self.config.devices.kind == "cuda", world))

    def _start_process(self, slot: int, gpu: int | None, init: str, standby: bool) -> None:
        rp = self.pool.start(slot, gpu, init, standby)
        self.outcome.errors.pop(slot, None)
        self.watchdog.forget(slot)
        ev = Rank(rank=slot, state=RankState.STARTING, pid=rp.process.pid, gpu=gpu,
                  device=f"GPU {gpu}" if gpu is not None else "cpu")
        self._handle(self._as_out(ev, "warming") if standby else ev)

    def _loop(self) -> None:
        next_sample = 0.0
        while self._world_alive():
            readers = [r.telemetry for r in self.pool.procs if not r.telemetry.closed]
            sentinels = [r.process.sentinel for r in self.pool.procs if r.alive]
            wait_any(readers + sentinels, timeout=0.1)
            self.pool.drain(self._from_rank)
            self._reap()
            self._run_commands()
            now = time.monotonic()
            if now >= next_sample:
                self._sample()
                next_sample = now + SAMPLE_EVERY_S
            running = [s for s in self.members if self.slots[s].state == RankState.RUNNING
                       and s not in self.world.leaving]
            # No verdict while the world changes: membership's change timeout judges the members
            # then, and a recovering member may take seconds to take its old world down.
            held = self.state.paused or not self.world.idle()
            self._act(self.watchdog.check(time.time(), [_member(self.slots[s]) for s in running
                                                        if self.slots[s].alive], held))
            if self._running():
                self._act(self.world.tick(time.time()))
            if self._autotuner is not None:
                self._autotuner.tick(now)
            if self._stop_deadline and now > self._stop_deadline:
                self.say("ranks did not stop in time: terminating them", "warning")
                self._end_now()
        self._reap()

    def _process_of(self, pid: int) -> tuple[str, float]:
        """A process's state and CPU, for the watchdog (the sampler is open by then)."""
        assert self.sampler is not None
        return self.sampler.process(pid)

    def _pipeline(self) -> Pipeline | None:
        """The input pipeline in force, for the input watch; None while --autotune tries
        settings (its trials are meant to differ) or a world change is under way."""
        if (self._autotuner and not self._autotuner.done) or not self.world.idle():
            return None
        settings = {**self.config.settings(self.config.devices.world_size), **self.state.settings}
        return Pipeline(cuda=self.config.devices.kind == "cuda", decode=self.config.data.decode,
                        files=self.config.data.jpeg_files,
                        workers=int(settings["workers"]), prefetch=bool(settings["prefetch"]),
                        ranks=len(self.members), cores=os.cpu_count() or 1)

    def _sample(self) -> None:
        self.pool.scan_children()
        slots = {s: (rp.process.pid, rp.gpu) for s, rp in self.slots.items() if rp.alive}
        self.sampler.sample(slots, self.pool.pids())
        self.sampler.forget()
        self.state.set_host(self.sampler.host())

    def _world_alive(self) -> bool:
        """Training goes on while a process of the world lives (standbys alone do not count)."""
        return any(self.slots[s].alive for s in set(self.members) | set(self.world.confirmed))

    def _reap(self) -> None:
        for r in self.pool.procs:
            code = r.process.exitcode
            if code is None or r.state.is_final:
                continue
            self.pool.drain(self._from_rank)
            current = self.slots[r.slot] is r
            if code == 0 and r.slot in self.world.leaving and r.slot not in self.members:
                self._set_state(r, RankState.STOPPED, None)  # the rank said where it left
                self._act(self.world.left(r.slot))
            elif code == 0:
                ours = self.outcome.stop or r.slot not in self.members
                self._set_state(r, RankState.STOPPED if ours else RankState.DONE, "")
            elif code == EXIT_USAGE:
                self._set_state(r, RankState.STOPPED, self.outcome.usage_error or "bad input")
                self._fail(EXIT_USAGE, self.outcome.usage_error or "bad input")
            elif self.outcome.ending or not current:
                self._set_state(r, RankState.STOPPED, "ended by ddptui")
            else:
                self._crashed(r)

    def _crashed(self, r: RankProcess) -> None:
        """A process died on its own (or by k): the world goes on without it, if it can."""
        reason = self.pool.killed.get(r.process.pid) or self.outcome.errors.get(r.slot) \
            or r.death()
        self._set_state(r, RankState.CRASHED, reason)
        member = r.slot in self.members or r.slot in self.world.confirmed
        restart = member and self._restarts < self.policy.max_restarts
        alive = self.pool.alive()
        recoverable = bool(self.config.checkpoint.snapshot_every and self.state.first_step_t)
        actions = self.world.died(r.slot, alive, recoverable, reason, time.time(), restart)
        self._act(actions)
        if restart and not self.outcome.failure:
            self._restarts += 1
            self.say(f"restarting rank {r.slot} ({self._restarts} of --max-restarts "
                     f"{self.policy.max_restarts})")

    def _set_state(self, r: RankProcess, state: RankState, reason: str | None) -> None:
        r.state = state
        if state.is_final:
            self.watchdog.forget(r.slot)
        self._handle(Rank(rank=r.slot, state=state.value, pid=r.process.pid, gpu=r.gpu,
                          reason=reason, exit_code=r.process.exitcode))

    def _fail(self, code: int, reason: str) -> None:
        """A rank lost beyond recovery, or bad input: the others are ended, cleanly and at once."""
        if self.outcome.fail(code, reason):
            self._end_now()

    def _tell(self, slot: int, order: Order) -> None:
        self.slots[slot].tell(order)
        if isinstance(order, (Recover, Reform)):
            self.watchdog.restart_clock(self.members, time.time())

    def _joining(self, slot: int) -> None:
        self._set_state(self.slots[slot], RankState.RESTARTING, "joining the world")

    def _running(self) -> bool:
        return not self.outcome.ending

    def _kill(self, slot: int, why: str) -> None:
        rp = self.slots.get(slot)
        if rp is None or not rp.alive:
            self.say(f"rank {slot} is not running", "warning")
            return
        self.say(f"killing rank {slot} ({why}): the others go on through crash recovery",
                 "warning")
        self.pool.kill(slot, why)

    # -- commands ------------------------------------------------------------------------------
    def _send(self, cmd: Order) -> None:
        self._act(self.world.to_leader(cmd))

    def _change_world(self, cmd: StopRank | RestartRank) -> None:
        slot, now = cmd.rank, time.time()
        if self._running() and slot in self.slots:
            self._act(self.world.stop(slot, now) if isinstance(cmd, StopRank) else
                      self.world.restart(slot, self.slots[slot].alive, now))

    def _kill_asked(self, cmd: KillRank) -> None:
        slot, flagged = cmd.rank, self.watchdog.flags.get(cmd.rank)
        if slot not in self.members:
            self.say(f"rank {slot} is not running", "warning")
            return
        self._kill(slot, f"k: {flagged}" if flagged else "k")

    def _ask_stacks(self, cmd: AskStacks) -> None:
        slot = cmd.rank
        rp = self.slots.get(slot)
        if rp is None or not rp.alive:
            self.say(f"rank {slot} has no live process to ask for its stacks", "warning")
            return
        self.watchdog.ask_stacks(_member(rp), time.time())

    def _standby(self, slot: int) -> None:
        """Keep a warm process for a rank that is out of the world (once the run goes on)."""
        if not self._running():
            return
        if not self.pool.warm_standby(slot):
            self._start_process(slot, self.slots[slot].gpu, "", standby=True)

    def _wind_down(self, code: int) -> None:
        for r in self.slots.values():  # standbys hold no state worth waiting for
            if r.slot not in self.members and r.alive:
                self._set_state(r, RankState.STOPPED, "the run is ending")
                r.process.terminate()
        stalled = [s for s in self.watchdog.stalled() if s in self.members]
        members = [self.slots[s] for s in self.members]
        if stalled:
            self._stop_past(stalled)
        elif any(r.state == RankState.RUNNING for r in members) and self.state.first_step_t:
            self.say("stopping: ranks finish their step"
                     + (" and checkpoint" if self.config.checkpoint.dir else ""))
            self._send(Stop())
            self._stop_deadline = time.monotonic() + STOP_GRACE_S
        else:  # still starting up: nothing to save, nothing to agree on
            self._end_now()

    def _stop_past(self, stalled: list[int]) -> None:
        """A stalled rank never reaches an agreed step: kill it; the others roll back to their
        newest common point, checkpoint from there and exit."""
        for s in stalled:
            self.pool.kill(s, "stalled at the stop")
        alive = self.pool.alive() - set(stalled)
        told = self.world.halt_without(stalled, alive, time.time()) \
            if self.config.checkpoint.snapshot_every and self.state.first_step_t else []
        if not told:
            self.say("stopping: the stalled ranks are ended, nothing is waited for")
            self._end_now()
            return
        self._act(told)
        self.say(f"stopping without rank {', '.join(map(str, stalled))} (stalled): the others "
                 "go back to their last common step"
                 + (", checkpoint" if self.config.checkpoint.dir else "") + " and end")
        self._stop_deadline = time.monotonic() + STALLED_STOP_S

    def _end_now(self) -> None:
        self.pool.end_all()
        self._stop_deadline = None


def _member(rp: RankProcess) -> Member:
    return Member(rp.slot, rp.process.pid, rp.gpu, rp.stacks_path)
