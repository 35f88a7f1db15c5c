"""`ddptui attach`: the dashboard for ranks started by torchrun or srun with --report. It listens,
authenticates every connection, folds what arrives into a RunState, and relays commands to the
world's rank 0; the processes belong to their launcher, so it never starts or stops one.
"""

from __future__ import annotations

import os
import threading
import time

from ddptui.contract.jsonl import JsonlWriter
from ddptui.contract.listener import ReportListener
from ddptui.contract.observe.endings import JOB_GRACE_S
from ddptui.contract.protocol.events import PARENT, Clock, Event, Lines, Notice, Rank, Run
from ddptui.contract.protocol.orders import (
    Apply,
    AskStacks,
    EndWrapped,
    KillWrapped,
    Order,
    Pause,
    Resume,
    TakeCheckpoint,
    settings_request,
)
from ddptui.contract.safe_text import plain
from ddptui.contract.stalls.scripts import STALL_S
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.source import RunSource
from ddptui.contract.wording import count
from ddptui.dashboard.sources.kept_state import (
    SAVE_EVERY_S,
    Kept,
    afresh,
    encoded,
    fields_of,
    restore,
    write,
)
from ddptui.dashboard.sources.remote_watch import RemoteWatch
from ddptui.dashboard.sources.thin_log import ThinLog

CHECK_EVERY_S = 0.5
DELEGATED = ("rank {rank} belongs to its launcher, not to ddptui: torchrun restarts the whole "
             "group when a rank fails (--max-restarts), srun ends the step; stop the job there "
             "(Ctrl-C to torchrun, scancel for SLURM)")


class Attach(RunSource):
    """The source behind the dashboard: start(), steer like a Supervisor, stop() detaches."""

    owns_ranks = False  # q detaches; training goes on
    can_end_job = True  # K: through each wrapped rank's sidecar

    def __init__(self, address: tuple[str, int], key: bytes, log_path: str, key_source: str,
                 stall_after: float = STALL_S, grace: float = JOB_GRACE_S):
        self.address, self.key, self.log_path, self.grace = address, key, log_path, grace
        self.state = RunState(_waiting(log_path, address))
        self.done = threading.Event()
        self.exit_code: int | None = None
        self.key_source = key_source
        self._link = ReportListener(address, key, self._received, self._note,
                                    self._check_finished, self._relay_lost)
        self._writer: JsonlWriter | None = None
        self._log: ThinLog | None = None
        self._finished = False
        self._world_size: int | None = None  # as rank 0 said at its start
        self._ends: dict[int, Rank] = {}  # rank -> the event of its end
        self._concluded = False  # the job's end said, from every rank's
        self._lock = threading.RLock()  # the listener's threads and the watch's
        self._watch = RemoteWatch(stall_after, self._record, self._ask_stacks)
        self._kept_t = 0.0  # when the state was last kept beside the log (monotonic)
        self._keeping = threading.Lock()  # the watch's keep and stop()'s: one file at a time
        self._keep_failed = False
        self._restored, self._not_restored = restore(log_path)
        if self._restored:
            self._resume(self._restored)

    def _resume(self, kept: Kept) -> None:
        """The job as the last attach on this log kept it, drawn at once; its wrapped ranks are
        waited for as if they had just reported (unreachable if none does within 5 s)."""
        self.state = kept.state
        self.state.meta["log"] = self.log_path
        self._world_size, self._finished, self._ends = kept.world_size, kept.finished, kept.ends
        self._watch.resume(kept.wrapped, kept.places, self.state.ranks, time.time())

    def _new_job(self, ev: Run) -> None:
        """A job's launch after the kept one's (that job ended while no attach watched): what
        was kept is let go, and the new job drawn from its start."""
        assert self._restored is not None
        if ev.t <= self._restored.saved_t:
            return  # the kept job's own start, in a backlog: old news
        self._restored = None
        afresh(self.state, _waiting(self.log_path, self.address))
        self._watch = RemoteWatch(self._watch.stalls.stall_after, self._record, self._ask_stacks)
        self._world_size, self._finished, self._ends = None, False, {}
        if self._log:
            self._log.start, self._log.ranks = None, set()
        self._note("info", "a new job began on this log: the one kept beside it has gone")

    def start(self) -> None:
        self._writer = JsonlWriter(self.log_path)
        self._log = ThinLog(self._writer.write)
        self._note("info", f"listening on {self.address[0]}:{self.address[1]} "
                   f"(key: {self.key_source})")
        if self._restored:
            self._log.start, self._log.ranks = self._restored.log_start, set(self.state.ranks)
            self._note("info", f"continuing {self.log_path}: the job as it was at "
                       f"{time.strftime('%H:%M:%S', time.localtime(self._restored.saved_t))} "
                       f"({count(len(self.state.ranks), 'rank')}), kept beside its log; "
                       "waiting for its ranks to report again")
        elif self._not_restored:
            self._note("warning", f"{self._not_restored}: starting empty")
        self._link.start()
        threading.Thread(target=self._judge, name="attach-watch", daemon=True).start()

    def stacks(self, rank: int) -> None:
        """A wrapped rank's stacks (python -m ddptui.wrap); others report through their loop."""
        if rank in self._watch.silence:
            self._ask_stacks(rank)
        else:
            self._note("warning", f"rank {rank} was not started under python -m ddptui.wrap: "
                       "it cannot be asked for its stacks (docs/cluster.md)")

    def kill_rank(self, rank: int) -> None:
        """k: a wrapped rank kills itself (SIGKILL); its launcher then does what it does."""
        if rank not in self._watch.silence:
            self._note("warning", f"rank {rank} was not started under python -m ddptui.wrap: "
                       "kill it where it runs (docs/cluster.md)")
        elif self._link.send(rank, KillWrapped()):
            self._note("warning", f"k: rank {rank} kills itself through its wrapper (SIGKILL); "
                       "its launcher now does what it does (torchrun: --max-restarts or the "
                       "end of the job; srun: the end of the step)")

    def end_job(self) -> None:
        """K: every wrapped rank that has not ended gets SIGTERM from its sidecar, and SIGKILL
        `grace` seconds later if it is still there; its launcher then ends as it does when its
        workers fail. A rank that cannot be reached, or was not wrapped, is named."""
        with self._lock:
            live = sorted(set(self._watch.silence) - set(self._ends))
            others = sorted(r.rank for r in self.state.view().ranks
                            if r.rank not in self._watch.silence and not r.state.is_final)
        asked = [r for r in live if self._link.send(r, EndWrapped(grace=self.grace))]
        if asked:
            self._note("warning", f"K: ending the job: SIGTERM to {count(len(asked), 'rank')} "
                       f"({', '.join(map(str, asked))}) through their wrappers, SIGKILL "
                       f"{self.grace:g} s later to any still there")
        missed = [r for r in live if r not in asked] + others
        if missed:
            self._note("error", f"K cannot reach rank {', '.join(map(str, missed))}: end it "
                       "where it runs (its launcher, kill, scancel)")
        if not asked and not missed:
            self._note("warning", "K: no rank of the job is running")

    def _ask_stacks(self, rank: int) -> bool:
        return self._link.send(rank, AskStacks(rank=rank))

    def _received(self, ev: Event) -> None:
        if isinstance(ev, Lines):  # a wrapped rank's output, kept as ddptui run keeps it
            self._keep_lines(ev)
            return
        if isinstance(ev, Clock):
            with self._lock:
                self._watch.clock.sync(ev.rank, ev.t, time.time())
            return
        with self._lock:
            if self._restored and isinstance(ev, Run) and ev.status == "started" \
                    and not ev.restart:
                self._new_job(ev)
            self._watch.observe(ev, time.time())
            self._record(ev)

    def _relay_lost(self, node: str, ranks: set[int]) -> None:
        with self._lock:
            self._watch.lost(node, ranks)
            self._watch.check(time.time())  # said now, not at the next check

    def _keep_lines(self, ev: Lines) -> None:
        path = f"{os.path.splitext(self.log_path)[0]}.rank{ev.rank}.out"
        text = "".join(f"{plain(str(line))}\n" for line in ev.lines)
        if ev.dropped:
            text += f"[ddptui: {ev.dropped} lines left out here: over 500 a second]\n"
        try:
            with open(path, "a") as f:
                f.write(text)
        except OSError as e:
            self._note("warning", f"cannot keep rank {ev.rank}'s output in {path}: {e}")

    def _judge(self) -> None:
        while not self.done.wait(CHECK_EVERY_S):
            with self._lock:
                self._watch.check(time.time())
            if time.monotonic() - self._kept_t >= SAVE_EVERY_S:
                self._keep()

    def _keep(self) -> None:
        """The state beside the log, for an attach restarted on it (kept_state.py): taken under
        the lock, so no event is half in it, and written outside it. Not once the log has
        stopped taking lines (a full disk): the state would be ahead of its log."""
        self._kept_t = time.monotonic()
        try:
            with self._keeping:
                with self._lock:
                    if self._writer is None or self._writer.failed:
                        return
                    data = encoded(self.log_path, self.state, fields_of(
                        self._world_size, self._finished, self._ends, list(self._watch.silence),
                        self._watch.places, self._log.start if self._log else None))
                write(self.log_path, data)
            self._keep_failed = False
        except Exception as e:  # noqa: BLE001 (the watch goes on: it judges the ranks)
            if not self._keep_failed:
                self._keep_failed = True
                self._note("warning", f"cannot keep the job's state beside {self.log_path} "
                           f"({getattr(e, 'strerror', None) or e}): an attach restarted on "
                           "this log would start empty")

    def stop(self, status: str = "interrupted", code: int = 130) -> None:
        """Detach: close the listener and every connection (the ranks keep training)."""
        if self.exit_code is None:
            self.exit_code = 0 if self._finished else code
        self._link.close()
        if self._writer and self._log:
            with self._lock:
                self._log.close()
            self._keep()
            with self._lock:
                self._writer.close()
        self.done.set()

    # -- steering: commands go to the world's rank 0, which agrees them with the others --------
    def pause(self) -> None:
        if self._command(Pause()):
            self._record(Run(rank=PARENT, status="pausing"))

    def resume(self) -> None:
        if self._command(Resume()):
            self._record(Run(rank=PARENT, status="resuming"))

    def checkpoint(self) -> None:
        self._command(TakeCheckpoint())

    def apply_now(self) -> None:
        self._command(Apply())

    def change_settings(self, request: str | None = None, **settings) -> None:
        requested, cmd = settings_request(settings, request)
        if self._command(cmd):  # one that was never sent would stay pending in the view
            self._record(requested)

    def stop_rank(self, rank: int) -> None:
        self._note("warning", DELEGATED.format(rank=rank))

    def restart_rank(self, rank: int) -> None:
        self._note("warning", DELEGATED.format(rank=rank))

    def _command(self, cmd: Order) -> bool:
        return self._link.order(cmd)

    def _record(self, ev: Event) -> None:
        self.state.apply(ev)
        if isinstance(ev, Run) and ev.status in ("done", "failed"):
            self._finished = True
            self.exit_code = 0 if ev.status == "done" else 1
        if self._log and not self.done.is_set():
            self._log.put(ev)
        if isinstance(ev, Run) and ev.status == "started" and ev.rank != PARENT:
            self._world_size, self._ends = ev.world_size, {}
        elif isinstance(ev, Rank) and ev.rank != PARENT:
            if ev.state in ("done", "crashed"):
                self._ends.setdefault(ev.rank, ev)
            elif ev.state == "running" and ev.pid:  # its launcher started it again
                self._ends.pop(ev.rank, None)

    def _job_end(self) -> None:
        """Where every rank of the job ended: the job's end, with its first failure as torchrun's root
        cause (rank 0 says how the job went, but nothing once killed, and its own failure where
        another rank's came first)."""
        if self._concluded or not self._world_size or len(self._ends) < self._world_size:
            return
        self._concluded = True
        failed = sorted((e for e in self._ends.values() if e.state == "crashed"),
                        key=lambda e: e.t)
        if not failed:
            if not self._finished:
                self._record(Run(rank=PARENT, status="done", exit_code=0,
                                 reason="every rank ended"))
            return
        first = failed[0]
        if self._finished and self.exit_code == 1 and first.rank == 0:
            return  # rank 0 said so, and it failed first
        self._record(Run(rank=PARENT, status="failed", exit_code=1,
                         reason=f"rank {first.rank}: {first.reason or 'failed'} (the first of "
                                f"{count(len(failed), 'rank')} that failed)"))

    def _note(self, level: str, text: str) -> None:
        with self._lock:
            self._record(Notice(rank=PARENT, level=level, text=text))

    def _check_finished(self) -> None:
        """Every connection has closed, so every event of the job is here: where every rank
        ended, or the job said it did, attach is done too."""
        if not self._link.idle() or self.done.is_set():
            return
        with self._lock:
            self._job_end()
        if self._finished:
            self.stop(code=self.exit_code or 0)


def _waiting(log_path: str, address: tuple[str, int]) -> dict:
    """What attach shows of a job before its ranks say what it is."""
    return {"log": log_path, "model": "waiting for ranks",
            "data": f"listening on {address[0]}:{address[1]}"}
