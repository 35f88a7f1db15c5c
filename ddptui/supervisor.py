"""The supervisor: spawns one process per rank, owns every process it started, and keeps the run
state; one thread polls telemetry, process sentinels and commands, decides and acts.

It also decides who is in the world: it orders leaves and joins (agreed by the ranks at a step),
recoveries when a rank dies (sent straight to the survivors), and keeps a warm standby process
for every rank that is out of the world, ready to join.
"""

from __future__ import annotations

import enum
import multiprocessing as mp
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from multiprocessing.connection import wait as wait_any

import psutil

from ddptui.runstate import RunState
from trainer.config import RunConfig
from trainer.protocol.events import PARENT, JsonlWriter, event

STOP_GRACE_S = 20.0  # agreed stop, final checkpoint and exit; then SIGTERM
TERM_GRACE_S = 3.0  # SIGTERM to SIGKILL
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class RankState(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    STANDBY = "standby"  # warmed up outside the world, ready to join
    STOPPED = "stopped"
    CRASHED = "crashed"
    RESTARTING = "restarting"  # joining the world
    DONE = "done"


FINAL = (RankState.DONE, RankState.CRASHED, RankState.STOPPED)


@dataclass
class RankProcess:
    """One process started for a rank slot (a slot gets a new process after a stop or crash)."""

    slot: int
    gpu: int | None
    process: mp.process.BaseProcess
    telemetry: object  # read end of this rank's telemetry pipe
    inbox: object  # write end of its command pipe (the world's rank 0 relays commands to all)
    standby: bool = False
    state: RankState = RankState.STARTING
    children: set = field(default_factory=set)  # pids of its DataLoader workers, as seen


def free_port() -> int:
    """A loopback port nobody listens on now (the rendezvous; a busy port is never our failure)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_log_path() -> str:
    return os.path.join("runs", time.strftime("%Y-%m-%dT%H-%M-%S") + ".jsonl")


class Supervisor:
    """Start with start(); steer with pause()/resume()/checkpoint()/change_settings()/
    apply_now()/stop_rank()/restart_rank()/stop(); wait() returns the exit code.
    Only this class starts or kills processes."""

    live = True  # there are ranks to steer (a Replay has none)
    owns_ranks = True  # q stops them (an Attach only detaches)

    def __init__(self, config: RunConfig, log_path: str | None = None):
        self.config = config
        self.log_path = log_path or config.log or default_log_path()
        self.state = RunState({
            "model": config.model, "data": config.data, "epochs": config.epochs,
            "world_size": config.world_size, "device_kind": config.device_kind,
            "gpus": list(config.gpus or []), "batch_size": config.batch_size,
            "log": self.log_path, "checkpoint_dir": config.checkpoint_dir,
        })
        self.procs: list[RankProcess] = []  # every process started, in order
        self.slots: dict[int, RankProcess] = {}  # each rank slot's current process
        self.members: list[int] = []  # the slots in the world (or in the world being formed)
        self._generation = 0
        self._world_change: dict | None = None  # an order the ranks have not confirmed yet
        self._deferred: list[tuple[str, int]] = []  # stop/restart asked during a world change
        self._leaving: set[int] = set()
        self._wanted: set[int] = set()  # slots to bring back as soon as their standby is ready
        self._restarts = 0
        self._autotuner = None
        self.exit_code: int | None = None
        self.done = threading.Event()
        # SimpleQueue: stop() runs in signal handlers, and Queue.put's lock is not reentrant.
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._stop_requested: tuple[str, int] | None = None
        self._stop_deadline: float | None = None
        self._failure: tuple[int, str] | None = None
        self._usage_error: str | None = None
        self._errors: dict[int, str] = {}  # rank -> its last error message
        self._writer: JsonlWriter | None = None
        self._thread = threading.Thread(target=self._main, name="supervisor", daemon=True)
        # Plain pipes, no multiprocessing Queue: a Queue's semaphores need the resource tracker
        # (which trips over Textual's stderr and warns about "leaked" locks of killed ranks) and
        # a shared Queue's lock, held by a rank killed mid-send, would silence every rank.
        self._ctx = mp.get_context("spawn")
        self._start_resource_tracker(os.path.splitext(self.log_path)[0] + ".tracker.out")

    # -- the API the app, the headless console and tests use ---------------------------------
    def start(self) -> None:
        self._writer = JsonlWriter(self.log_path)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.exit_code

    def pause(self) -> None:
        self._commands.put({"op": "pause"})

    def resume(self) -> None:
        self._commands.put({"op": "resume"})

    def checkpoint(self) -> None:
        self._commands.put({"op": "checkpoint"})

    def change_settings(self, **settings) -> None:
        """Ask for new input-pipeline settings; every rank applies them at the next epoch."""
        self.state.apply(event("settings", PARENT, settings=settings, status="requested"))
        self._commands.put({"op": "settings", "settings": settings})

    def apply_now(self) -> None:
        """Pending settings take effect at the next agreed step instead of the next epoch."""
        self._commands.put({"op": "apply"})

    def stop_rank(self, rank: int) -> None:
        """The rank leaves at an agreed step; the others go on re-sharded as one fewer."""
        self._commands.put({"op": "stop_rank", "slot": rank})

    def restart_rank(self, rank: int) -> None:
        """A stopped or crashed rank joins again; a running one leaves and joins again."""
        self._commands.put({"op": "restart_rank", "slot": rank})

    def stop(self, status: str = "interrupted", code: int = EXIT_INTERRUPTED) -> None:
        """Orderly end: ranks agree on a step, checkpoint if a directory is set, and exit.
        A second call while stopping ends every process at once."""
        self._commands.put({"op": "stop", "status": status, "code": code})

    def pids(self) -> set[int]:
        """Every process of the run seen so far: ranks and their workers."""
        found = set()
        for r in self.procs:
            if r.process.pid:
                found.add(r.process.pid)
            found |= r.children
        return found

    @staticmethod
    def _start_resource_tracker(path: str) -> None:
        """Start multiprocessing's resource tracker (spawn needs it) with its stderr in a file.

        It inherits fd 2: on the terminal its warnings about the named semaphores of a rank we
        had to kill would garble the one-line error promise and the dashboard. And it must start
        before Textual runs, since it also asks sys.stderr for a file descriptor.
        """
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        saved = os.dup(2)
        try:
            os.dup2(fd, 2)
            resource_tracker.ensure_running()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(fd)

    # -- the supervisor thread -----------------------------------------------------------------
    def _emit(self, kind: str, **fields) -> None:
        self._handle(event(kind, PARENT, **fields))

    def _handle(self, ev: dict) -> None:
        self.state.apply(ev)
        if self._writer:
            self._writer.write(ev)
        kind = ev["kind"]
        if kind == "message" and ev.get("level") == "error":
            self._errors[ev["rank"]] = ev.get("text", "")
            if ev.get("usage") and self._usage_error is None:
                self._usage_error = ev.get("text", "bad input")
        elif kind == "rank" and ev["rank"] in self.slots:
            rp = self.slots[ev["rank"]]
            if ev.get("state") == "running" and rp.state not in FINAL:
                rp.state = RankState.RUNNING
            elif ev.get("state") == "standby" and rp.state == RankState.STARTING:
                rp.state = RankState.STANDBY
                self._next_change()
        elif kind == "world" and ev["rank"] != PARENT and self._world_change is not None \
                and ev.get("generation") == self._world_change["gen"]:
            self._world_change = None
            self._next_change()

    def _main(self) -> None:
        code = EXIT_FAILED
        try:
            self._emit("run", status="started", pid=os.getpid(), **self.state.meta)
            self._prepare_data()
            if self._stop_requested is None:
                self._spawn()
                self._loop()
            code, status, reason = self._outcome()
            self._emit("run", status=status, exit_code=code, reason=reason,
                       seconds=round(time.time() - (self.state.started_t or time.time()), 2),
                       best_val_acc=self.state.best_val_acc)
        except Exception as e:  # a bug of ours: still end every process and say why
            self._emit("run", status="failed", exit_code=EXIT_FAILED,
                       reason=f"supervisor error: {type(e).__name__}: {e}")
            raise
        finally:
            self._end_all()
            self._drain_telemetry()
            self._close_pipes()
            if self._writer:
                self._writer.close()
            self.exit_code = code if self.exit_code is None else self.exit_code
            self.done.set()

    def _prepare_data(self) -> None:
        """Generate the built-in dataset here, once, with progress, before ranks race for it."""
        if self.config.data_kind != "shapes":
            return
        from trainer.shapes import ensure_shapes

        last = [0.0]

        def progress(done: int, total: int) -> None:
            if time.time() - last[0] > 0.5 or done == total:
                last[0] = time.time()
                self.say(f"generating shapes dataset {done}/{total}")

        ensure_shapes(progress)

    def _spawn(self) -> None:
        world = self.config.world_size
        init = f"tcp://127.0.0.1:{free_port()}"
        gpus = list(self.config.gpus) if self.config.gpus else [None] * world
        if self.config.strategy == "dp":  # one process holds every GPU
            gpus = gpus[:1]
        self.say(f"starting {world} ranks")
        for slot, gpu in enumerate(gpus):
            self._start_process(slot, gpu, init, standby=False)
        self.members = list(range(world))
        self._emit("world", size=world, ranks=list(self.members), generation=0)
        if self.config.autotune:
            from ddptui.autotune import Autotuner, candidates

            self._autotuner = Autotuner(self, candidates(
                self.config.settings(world), self.config.device_kind == "cuda", world))

    def _start_process(self, slot: int, gpu: int | None, init: str, standby: bool) -> None:
        from trainer.bootstrap import RankSpec, run_rank

        stem = os.path.splitext(self.log_path)[0]
        spec = RankSpec(self.config, slot, slot, self.config.world_size, init, gpu, os.getpid(),
                        f"{stem}.rank{slot}.out", standby=standby)
        telemetry, telemetry_end = self._ctx.Pipe(duplex=False)
        inbox_end, inbox = self._ctx.Pipe(duplex=False)
        p = self._ctx.Process(target=run_rank, args=(spec, telemetry_end, inbox_end),
                              name=f"ddptui-rank{slot}", daemon=False)
        p.start()
        telemetry_end.close()  # the rank holds these ends; EOF now means it is gone
        inbox_end.close()
        rp = RankProcess(slot, gpu, p, telemetry, inbox, standby=standby)
        self.procs.append(rp)
        self.slots[slot] = rp
        self._errors.pop(slot, None)
        self._handle(event("rank", slot, state="starting", pid=p.pid, gpu=gpu, standby=standby,
                           device=f"cuda:{gpu}" if gpu is not None else "cpu",
                           reason="standby: warming up to join" if standby else ""))

    def _loop(self) -> None:
        next_scan = 0.0
        while self._world_alive():
            readers = [r.telemetry for r in self.procs if not r.telemetry.closed]
            sentinels = [r.process.sentinel for r in self.procs if r.process.exitcode is None]
            wait_any(readers + sentinels, timeout=0.1)
            self._drain_telemetry()
            self._reap()
            self._run_commands()
            now = time.monotonic()
            if now >= next_scan:
                self._scan_children()
                self._sample_host()
                next_scan = now + 1.0
            if self._autotuner is not None:
                self._autotuner.tick(now)
            if self._stop_deadline and now > self._stop_deadline:
                self._emit("message", level="warning",
                           text="ranks did not stop in time: terminating them")
                self._end_all()
        self._reap()

    def say(self, text: str, **fields) -> None:
        """A message of the supervisor's own, in the log and the event pane (its thread only)."""
        self._emit("message", level="info", text=text, **fields)

    def world_changing(self) -> bool:
        return self._world_change is not None

    def autotune_done(self, best: dict, rate: float, results: list) -> None:
        from ddptui.autotune import describe_settings

        tried = "; ".join(f"{describe_settings(s)} {r:,.0f}" for s, r in results)
        self.say(f"autotune kept {describe_settings(best)} ({rate:,.0f} img/s; tried {tried})",
                 autotune=best)

    def _world_alive(self) -> bool:
        """Training goes on while a process of the world lives (standbys alone do not count)."""
        return any(self.slots[s].process.exitcode is None for s in self.members)

    def _drain_telemetry(self) -> None:
        for r in self.procs:
            try:
                while not r.telemetry.closed and r.telemetry.poll():
                    self._handle(r.telemetry.recv())
            except (EOFError, OSError):
                r.telemetry.close()

    def _reap(self) -> None:
        for r in self.procs:
            code = r.process.exitcode
            if code is None or r.state in FINAL:
                continue
            self._drain_telemetry()
            member = r.slot in self.members and self.slots[r.slot] is r
            if code == 0 and r.slot in self._leaving and not member:
                self._leaving.discard(r.slot)
                self._set_state(r, RankState.STOPPED, None)  # the rank said where it left
                self._bring_up_standby(r.slot)
            elif code == 0:
                ours = self._stop_requested or not member
                self._set_state(r, RankState.STOPPED if ours else RankState.DONE, "")
            elif code == EXIT_USAGE:
                self._set_state(r, RankState.STOPPED, self._usage_error or "bad input")
                self._fail(EXIT_USAGE, self._usage_error or "bad input")
            elif self._failure or self._stop_requested or r.state == RankState.STOPPED:
                self._set_state(r, RankState.STOPPED, "ended by ddptui")
            else:
                reason = self._death_reason(r, code)
                self._set_state(r, RankState.CRASHED, reason)
                if member:
                    self._lost(r, reason)
                else:
                    self._emit("message", level="warning",
                               text=f"standby for rank {r.slot} {reason}; r starts another")

    def _set_state(self, r: RankProcess, state: RankState, reason: str | None) -> None:
        r.state = state
        self._emit_rank(r, state.value, reason)

    def _lost(self, r: RankProcess, reason: str) -> None:
        """A rank of the world died: the survivors re-form without it, or the run fails."""
        survivors = [s for s in self.members
                     if s != r.slot and self.slots[s].process.exitcode is None]
        if not (self.config.snapshot_every and self.state.first_step_t and survivors):
            self._fail(EXIT_FAILED, f"rank {r.slot} {reason}")
            return
        order = self._order("recover", survivors)
        for s in survivors:
            self._tell(self.slots[s], order)
        self._emit("message", level="warning",
                   text=f"rank {r.slot} {reason}: going on with {len(survivors)} "
                   f"rank{'s' if len(survivors) > 1 else ''} from their last common step")
        if self._restarts < self.config.max_restarts:
            self._restarts += 1
            self._wanted.add(r.slot)
            self.say(f"restarting rank {r.slot} ({self._restarts} of --max-restarts "
                     f"{self.config.max_restarts})")
        self._bring_up_standby(r.slot)

    def _order(self, op: str, members: list[int], **extra) -> dict:
        """A world-change order: the new members, where they meet, and its generation."""
        self._generation += 1
        order = {"op": op, "members": sorted(members), "gen": self._generation,
                 "init": f"tcp://127.0.0.1:{free_port()}", **extra}
        self.members = order["members"]
        self._world_change = order
        return order

    def _emit_rank(self, r: RankProcess, state: str, reason: str | None) -> None:
        self._handle(event("rank", r.slot, state=state, pid=r.process.pid, gpu=r.gpu,
                           reason=reason, exit_code=r.process.exitcode))

    def _death_reason(self, r: RankProcess, code: int) -> str:
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"killed by {name}"
        return self._errors.get(r.slot) or f"exited with code {code}"

    def _fail(self, code: int, reason: str) -> None:
        """A rank lost beyond recovery, or bad input: the others are ended, cleanly and at once."""
        if self._failure is None and self._stop_requested is None:
            self._failure = (code, reason)
            self._end_all()

    def _run_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            op = cmd["op"]
            if op == "stop":
                self._begin_stop(cmd["status"], cmd["code"])
            elif op in ("stop_rank", "restart_rank"):
                self._rank_command(op, cmd["slot"])
            else:
                self._send(cmd)

    def _rank_command(self, op: str, slot: int) -> None:
        if self._stop_requested or self._failure or slot not in self.slots:
            return
        if self._world_change is not None:  # one change at a time: this one waits its turn
            self._deferred.append((op, slot))
        elif op == "restart_rank":
            self._restart(slot)
        else:
            self._leave(slot)

    def _restart(self, slot: int) -> None:
        """The slot joins from its warm standby: now if it is ready, else once it is; a running
        rank leaves first."""
        running = slot in self.members
        self._wanted.add(slot)
        self.say(f"restarting rank {slot}: it joins again from a warm standby"
                 + (" after leaving" if running else ""))
        if running:
            self._leave(slot)
            return
        if self.slots[slot].process.exitcode is not None:  # its standby died too
            self._bring_up_standby(slot)
        self._next_change()

    def _leave(self, slot: int) -> None:
        if slot not in self.members:
            self._emit("message", level="warning", text=f"rank {slot} is not running")
        elif len(self.members) == 1:
            self._wanted.discard(slot)
            self._emit("message", level="warning",
                       text=f"rank {slot} is the last rank: q ends the run instead")
        else:
            leader = self.slots[self.members[0]]
            order = self._order("reform", [s for s in self.members if s != slot])
            self._leaving.add(slot)
            self._send(order, leader)
            self.say(f"stopping rank {slot}: it leaves at the next agreed step, the other "
                     f"{len(self.members)} go on")

    def _next_change(self) -> None:
        """After a world change: the next asked-for stop/restart, or a wanted rank's join."""
        while self._world_change is None and self._deferred:
            self._rank_command(*self._deferred.pop(0))
        if self._world_change is not None or self._stop_requested or self._failure:
            return
        ready = [s for s in sorted(self._wanted) if self.slots[s].state == RankState.STANDBY]
        if not ready or not self.members:
            return
        slot = ready[0]
        self._wanted.discard(slot)
        leader = self.slots[self.members[0]]
        order = self._order("reform", self.members + [slot], joiner=slot)
        joiner = self.slots[slot]
        self._send(order, leader)
        self._tell(joiner, {**order, "op": "join"})
        self._set_state(joiner, RankState.RESTARTING, "joining the world")

    def _bring_up_standby(self, slot: int) -> None:
        """Keep a warm process for a rank that is out of the world (once the run goes on)."""
        if self._stop_requested or self._failure:
            return
        current = self.slots[slot]
        if current.process.exitcode is None and current.standby:
            return
        self._start_process(slot, current.gpu, "", standby=True)

    def _send(self, cmd: dict, to: RankProcess | None = None) -> None:
        # The world's rank 0 is the authority: it offers commands to every rank at an agreed step.
        if to is None:
            if not self.members:
                return
            to = self.slots[self.members[0]]
        self._tell(to, cmd)

    def _tell(self, r: RankProcess, cmd: dict) -> None:
        if r.process.exitcode is None:
            try:
                r.inbox.send(cmd)
            except OSError:  # it died this instant; the sentinel says so next
                pass

    def _close_pipes(self) -> None:
        for r in self.procs:
            r.telemetry.close()
            r.inbox.close()

    def _begin_stop(self, status: str, code: int) -> None:
        if self._stop_requested is not None:  # asked twice: no more waiting
            self._end_all()
            return
        self._stop_requested = (status, code)
        self.say("stopping: ranks finish their step"
                 + (" and checkpoint" if self.config.checkpoint_dir else ""))
        for r in self.slots.values():  # standbys hold no state worth waiting for
            if r.slot not in self.members and r.process.exitcode is None:
                r.state = RankState.STOPPED
                r.process.terminate()
        members = [self.slots[s] for s in self.members]
        if any(r.state == RankState.RUNNING for r in members) and self.state.first_step_t:
            self._send({"op": "stop"})
            self._stop_deadline = time.monotonic() + STOP_GRACE_S
        else:  # still starting up: nothing to save, nothing to agree on
            self._end_all()

    def _outcome(self) -> tuple[int, str, str]:
        if self._failure:
            code, reason = self._failure
            return code, "failed", reason
        if self._stop_requested:
            status, code = self._stop_requested
            return code, status, ""
        if self.members and all(self.slots[s].state == RankState.DONE for s in self.members):
            return EXIT_OK, "done", ""
        return EXIT_FAILED, "failed", "ranks ended unexpectedly"

    def _sample_host(self) -> None:
        mem = psutil.virtual_memory()
        self.state.set_host({"cpu_percent": psutil.cpu_percent(), "mem_percent": mem.percent,
                             "mem_used": (mem.total - mem.available) >> 20,
                             "mem_total": mem.total >> 20, "cpus": psutil.cpu_count()})

    def _scan_children(self) -> None:
        for r in self.procs:
            if r.process.exitcode is None and r.process.pid:
                try:
                    r.children |= {c.pid for c in psutil.Process(r.process.pid).children(True)}
                except psutil.Error:
                    pass

    def _end_all(self) -> None:
        """SIGTERM every live rank, SIGKILL what is left, then any worker that outlived its rank.

        Ranks are our children and are reaped through multiprocessing (psutil must not wait on
        them); their DataLoader workers are not, so psutil watches those by pid.
        """
        self._scan_children()
        workers = []
        for pid in {pid for r in self.procs for pid in r.children}:
            try:
                workers.append(psutil.Process(pid))
            except psutil.Error:
                pass
        live = [r.process for r in self.procs if r.process.exitcode is None]
        for p in live:
            p.terminate()
        deadline = time.monotonic() + TERM_GRACE_S
        for p in live:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in live:
            if p.exitcode is None:
                p.kill()
                p.join(TERM_GRACE_S)
        for w in workers:
            try:
                w.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(workers, timeout=TERM_GRACE_S)
        self._stop_deadline = None
