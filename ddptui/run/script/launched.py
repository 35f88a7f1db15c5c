"""A script that starts its own ranks (mp.spawn), as its run sees it: the door its ranks come
in at, each adopted as it joins a process group, the launcher's output and end. Part of ScriptRun.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace

from ddptui.contract.observe.endings import crash_cause
from ddptui.contract.observe.launchers import collided
from ddptui.contract.options.script import ScriptConfig
from ddptui.contract.protocol.events import PARENT, Event, Notice, Rank, World
from ddptui.contract.state.runstate import RunState
from ddptui.contract.states import RankState
from ddptui.run.outcome import Outcome
from ddptui.run.script.group import LAUNCHER, RankGroup, ScriptRank
from ddptui.run.script.launch import described
from ddptui.run.script.roster import ScriptWorld
from ddptui.run.script.spawned import RankDoor
from ddptui.run.script.watch import ScriptWatch

LAUNCHER_LINES = 10  # a launcher's lines shown a second, at most
SAME_FAILURE_S = 30.0  # copies of a script that fail alike this soon after their start


class LaunchedRanks:
    """For ScriptRun: reads its group, watch, world, state and outcome, and says through it.
    What it takes of its run, declared (ScriptRun sets each before its thread starts):"""

    config: ScriptConfig
    group: RankGroup
    door: RankDoor
    watch: ScriptWatch
    world: ScriptWorld
    state: RunState
    outcome: Outcome
    meta: dict
    say: Callable[..., None]  # OwnedRun.say
    _handle: Callable[[Event], None]
    _fail: Callable[[int, str], None]
    _ending: bool  # ScriptRun._ending
    _restart: bool
    _restarted_why: str

    @staticmethod
    def _door(put: Callable[[object], None]) -> RankDoor:
        """A lone process may start ranks of its own: they come in at this door, as items of
        the run's inbox."""
        return RankDoor(lambda hello, fd: put(("adopt", hello, fd)),
                        lambda pid, code: put(("ended", pid, code)),
                        lambda pid, how: put(("launches", pid, how)),
                        lambda text: put(Notice(rank=PARENT, level="warning", text=text)))

    def _launched(self) -> bool:
        """A new attempt started: no rank of it has failed, its process (a launcher, or a lone
        rank that may be one) is whose ranks the door lets in; whether it is a launcher."""
        self._failed_rank: int | None = None
        self._launcher_second, self._launcher_said = 0, 0
        self._attempt_t, self._crashes = time.time(), []
        first = self.group.ranks[0]
        self.door.launcher = first.pid
        if first.slot == LAUNCHER:
            self.say(f"launcher started (pid {first.pid}): its ranks are shown as they join a "
                     "process group")
        return first.slot == LAUNCHER

    def _failure_signal(self) -> int | None:
        """What the others get when a rank failed: SIGTERM, as torchrun sends it; none while a
        launcher is there to end them as it does (mp.spawn: SIGTERM), SIGINT after half the
        grace period if it has not."""
        launcher = self.group.launcher
        return None if launcher is not None and launcher.alive else signal.SIGTERM

    def _ended_by(self, r: ScriptRank) -> str:
        """Who ended a rank while the run was ending: ddptui, or (a rank it never signalled)
        the script's launcher, after a rank's failure."""
        if not r.adopted or self.group.signalled:
            return f"ended by ddptui ({r.death()})"
        after = "" if self._failed_rank is None else f" after rank {self._failed_rank} failed"
        return f"ended by the script's launcher ({r.death()}){after}"

    def _from_launcher(self, item: tuple, now: float) -> None:
        """An item of the inbox from the launcher's side: a line of its own, a rank that came
        in at the door, the exit code of a child it waited for."""
        match item:
            case ("line", _slot, text, final):
                self._launcher_line(text, final)
            case ("adopt", hello, fd):
                self._adopt(hello, fd, now)
            case ("ended", pid, code):
                for r in self.group.ranks:
                    if r.adopted and r.pid == pid:
                        r.popen.told = code
            case ("launches", pid, how):
                self._relaunch(pid, how)

    def _relaunch(self, pid: int, how: str) -> None:
        """A rank turned out to start ranks of its own (from inside a library, where reading
        the script could not see it; it waits in the call): every copy ends and the script
        starts again, once, as their launcher, with none of torchrun's variables."""
        if self.config.launch or self.outcome.stop is not None or \
                pid not in {r.pid for r in self.group.alive() if not r.adopted}:
            return  # said already, by another copy, or the run is ending
        said = (f"{self.config.label} starts its own ranks ({how}): ddptui starts it again, "
                "once, as their launcher, with none of torchrun's variables")
        self.config = replace(self.config, launch=said)
        self.group.config = self.watch.config = self.config
        self.meta["world_size"], self.meta["launcher"] = self.config.world_size, said
        self._restart, self._restarted_why = True, "started again as its ranks' launcher"
        for r in self.group.alive():  # they wait in the launching call: nothing to end cleanly
            r.kill()

    def _adopt(self, hello: dict, fd: int, now: float) -> None:
        """A process under the launcher joined a process group: a rank of its own from now."""
        launcher = self.group.ranks[0]
        if hello["launcher"] != launcher.pid or not launcher.alive:
            os.close(fd)  # a rank of an attempt that is over
            return
        if launcher.slot != LAUNCHER:  # a lone rank (--nproc-per-node 1) that launches
            launcher.slot = LAUNCHER
            self.watch.finished(0, True, launcher.pid)
            self.say(f"{described(self.config)} started ranks of its own: pid {launcher.pid} "
                     "is their launcher, each rank is shown as it joins a process group")
        r, new = self.group.adopt(hello, fd)
        if not new:
            return
        self.world.slots.append(r.slot)
        self.watch.attempt([r.slot], now)
        self._handle(Rank(rank=r.slot, state=RankState.RUNNING, pid=r.pid, gpu=r.gpu,
                           device=f"GPU {r.gpu}" if r.gpu is not None else "cpu",
                           reason=f"joined a process group of {hello['world']} "
                                  f"(started by pid {launcher.pid})"))
        if hello["world"] != self.state.meta.get("world_size"):
            self._handle(World(rank=PARENT, size=hello["world"],
                               ranks=list(range(hello["world"])), generation=0))

    def _copies_failed(self, text: str) -> None:
        """Copies of a script that starts its own ranks collided on its port (the first
        failure says so), or every copy failed the same way within seconds of its start (a
        launcher ddptui does not know: each copy made a job of its own): said once, with the
        form that runs it once."""
        said = collided(text, self.config.world_size, described(self.config))
        if said and self.outcome.failure is None:
            self.say(said, "warning")
        self._crashes.append(text)
        n = self.config.world_size
        if self.config.launch or n < 2 or len(self._crashes) != n or \
                len(set(self._crashes)) != 1 or time.time() - self._attempt_t > SAME_FAILURE_S:
            return
        self.say(f"all {n} copies of the script failed the same way within "
                 f"{SAME_FAILURE_S:.0f} s of starting ({text}): a script that starts its own "
                 f"ranks runs once: ddptui run --nproc-per-node 1 {described(self.config)}",
                 "warning")

    def _blame_first(self, r: ScriptRank) -> tuple[bool, bool]:
        """Ranks that ended together, the one that caused it first: killed with k, else one
        that exited by itself, before those a signal ended (a launcher's SIGTERM to the rest)."""
        code = r.popen.returncode
        return r.pid not in self.world.killed, code is not None and code < 0

    def _launcher_line(self, text: str, final: bool) -> None:
        """The launcher's own output: in its .out file and on (headless); on screen as
        messages, LAUNCHER_LINES a second at most (the rest is in the file)."""
        if not final or not text.strip() or self._failed_rank is not None:
            return  # after a rank's failure: mp.spawn's copy of its traceback, in the file
        second = int(time.monotonic())
        if second != self._launcher_second:
            self._launcher_second, self._launcher_said = second, 0
        self._launcher_said += 1
        if self._launcher_said <= LAUNCHER_LINES:
            self.say(f"launcher: {text}")

    def _launcher_ended(self, r: ScriptRank) -> None:
        """The launcher's end is the job's: its failure counts when no rank failed first."""
        self.watch.flush_lines(time.time(), force=True)
        ranks = [x for x in self.group.ranks if x.slot != LAUNCHER]
        if r.popen.returncode == 0:
            self.say(f"the launcher (pid {r.pid}) exited with code 0"
                     + ("" if ranks else ": no process of it joined a process group"))
            return
        text = crash_cause(r.popen.returncode, r.traceback())
        self.say(f"the launcher (pid {r.pid}) {r.death()}: {text}", "error")
        if self.outcome.failure is None and not self._ending:
            self._fail(r.exit_code, f"the script's launcher {r.ended_with(text)}")

