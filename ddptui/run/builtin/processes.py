"""The rank processes of a run: how one is started (from the fork server, pipes, its files), how
its DataLoader workers are found, and how all of them are ended. Only the supervisor's thread
calls this.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, field

import psutil

from ddptui.contract.observe.endings import SELF_INFLICTED, crash_cause, ended_how, tail_lines
from ddptui.contract.options.config import RunConfig
from ddptui.contract.protocol.codec import decode, encode
from ddptui.contract.protocol.orders import Order
from ddptui.contract.rankspec import RankSpec, run_builtin_rank
from ddptui.contract.states import RankState
from ddptui.run.builtin.helpers import ending, forkserver_pid, start_helpers

TERM_GRACE_S = 3.0  # SIGTERM to SIGKILL
SERVER_TRIES = 3  # a rank's start, when its server dies as it is asked
SERVER_GONE = 255  # the exit code multiprocessing gives a rank whose fork server died



@dataclass
class RankProcess:
    """One process started for a rank slot (a slot gets a new process after a stop or crash)."""

    slot: int
    gpu: int | None
    process: mp.process.BaseProcess
    telemetry: object  # read end of this rank's telemetry pipe
    inbox: object  # write end of its command pipe (the world's rank 0 relays commands to all)
    stacks_path: str  # where it writes its Python stacks when sent SIGUSR1
    out_path: str  # its stdout and stderr
    standby: bool = False
    state: RankState = RankState.STARTING
    children: set = field(default_factory=set)  # pids of its DataLoader workers, as seen
    server: int | None = None  # the pid of the fork server it was forked from

    @property
    def alive(self) -> bool:
        return self.process.exitcode is None

    def tell(self, cmd: Order) -> None:
        if self.alive:
            try:
                self.inbox.send_bytes(encode(cmd).encode())
            except OSError:  # it died this instant; the sentinel says so next
                pass

    def death(self) -> str:
        code = self.process.exitcode
        if code is not None and code < 0 and -code in SELF_INFLICTED:  # a device assert, say
            return crash_cause(code, tail_lines(self.out_path))
        if code == SERVER_GONE and ending(self.server):
            return "ended with the fork server it was started from, which died (killed?)"
        return ended_how(code)


class ProcessPool:
    """Starts rank processes from the fork server and ends every one of them (and their
    workers) on the way out."""

    def __init__(self, config: RunConfig, log_path: str):
        self.config = config
        self.stem = os.path.splitext(log_path)[0]
        self.procs: list[RankProcess] = []  # every process started, in order
        self.slots: dict[int, RankProcess] = {}  # each rank slot's current process
        self.killed: dict[int, str] = {}  # pid -> why ddptui killed it
        # Plain pipes, no multiprocessing Queue: a Queue's semaphores need the resource tracker
        # (which trips over Textual's stderr and warns about "leaked" locks of killed ranks) and
        # a shared Queue's lock, held by a rank killed mid-send, would silence every rank.
        self._ctx = start_helpers(self.stem + ".tracker.out")

    def start(self, slot: int, gpu: int | None, init: str, standby: bool) -> RankProcess:
        stacks, out = f"{self.stem}.rank{slot}.stacks", f"{self.stem}.rank{slot}.out"
        spec = RankSpec(self.config, slot, slot, self.config.devices.world_size, init, gpu,
                        parent_pid=os.getpid(), output_path=out, stacks_path=stacks,
                        standby=standby, environ=dict(os.environ))
        telemetry, telemetry_end = self._ctx.Pipe(duplex=False)
        inbox_end, inbox = self._ctx.Pipe(duplex=False)
        p = self._ctx.Process(target=run_builtin_rank, args=(spec, telemetry_end, inbox_end),
                              name=f"ddptui-rank{slot}", daemon=False)
        for attempt in range(SERVER_TRIES):
            try:
                p.start()
                break
            except (EOFError, OSError):  # the server died as it was asked (killed?)
                if attempt == SERVER_TRIES - 1:
                    raise
                time.sleep(0.2)  # until it is gone: then a new one starts as the first did
                start_helpers(self.stem + ".tracker.out")
        telemetry_end.close()  # the rank holds these ends; EOF now means it is gone
        inbox_end.close()
        # A rank's status comes through its server, and the rank dies with it
        rp = RankProcess(slot, gpu, p, telemetry, inbox, stacks, out, standby=standby,
                         server=forkserver_pid())
        self.procs.append(rp)
        self.slots[slot] = rp
        return rp

    def alive(self) -> set[int]:
        """The slots whose current process lives."""
        return {s for s, rp in self.slots.items() if rp.alive}

    def kill(self, slot: int, why: str) -> None:
        """SIGKILL the slot's current process, remembering why (its crash is reported so)."""
        rp = self.slots[slot]
        self.killed[rp.process.pid] = f"killed by ddptui ({why})"
        os.kill(rp.process.pid, signal.SIGKILL)

    def warm_standby(self, slot: int) -> bool:
        """The slot's current process is a standby that is not being killed."""
        rp = self.slots[slot]
        return rp.alive and rp.standby and rp.process.pid not in self.killed

    def drain(self, handle) -> None:
        """Every event the ranks have sent so far, to `handle`; a closed pipe is a gone rank."""
        for r in self.procs:
            try:
                while not r.telemetry.closed and r.telemetry.poll():
                    ev = decode(r.telemetry.recv_bytes())
                    if ev is not None:
                        handle(ev)
            except (EOFError, OSError):
                r.telemetry.close()

    def pids(self) -> set[int]:
        found = set()
        for r in self.procs:
            if r.process.pid:
                found.add(r.process.pid)
            found |= r.children
        return found

    def scan_children(self) -> None:
        for r in self.procs:
            if r.alive and r.process.pid:
                try:
                    r.children |= {c.pid for c in psutil.Process(r.process.pid).children(True)}
                except psutil.Error:
                    pass

    def end_all(self) -> None:
        """SIGTERM every live rank, SIGKILL what is left, then any worker that outlived its rank.

        Ranks are our children and are reaped through multiprocessing (psutil must not wait on
        them); their DataLoader workers are not, so psutil watches those by pid.
        """
        self.scan_children()
        workers = []
        for pid in {pid for r in self.procs for pid in r.children}:
            try:
                workers.append(psutil.Process(pid))
            except psutil.Error:
                pass
        live = [r.process for r in self.procs if r.alive]
        for p in live:
            p.terminate()
        _join_all(live, TERM_GRACE_S)
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

    def close(self) -> None:
        for r in self.procs:
            r.telemetry.close()
            r.inbox.close()


def _join_all(processes, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
