"""The processes of one start of a script: one per rank, each the leader of its own process group
(setsid, as torchrun starts them), its stdout and stderr read by threads; signals go to whole
groups, so DataLoader workers and other children are ended with their rank.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from ddptui.contract.observe.endings import ended_how
from ddptui.contract.observe.flight import trace_prefix
from ddptui.contract.observe.output import Console, StreamReader, last_traceback
from ddptui.contract.observe.streams import Route
from ddptui.contract.observe.vitals import phases_path, vitals_path
from ddptui.contract.options.script import ScriptConfig
from ddptui.contract.protocol.codec import parse
from ddptui.contract.wording import count
from ddptui.run.outcome import EXIT_FAILED
from ddptui.run.script.launch import Attempt, command, rank_env
from ddptui.run.script.spawned import Adopted

_FRAME = re.compile(r'\s*File "(.+)", line (\d+)')
LAUNCHER = -2  # the slot of a script that starts its own ranks: the job's launcher, not a rank
HUNG_GRACE_S = 3.0  # a stalled rank, or one blocked on it, gets no longer to end on a stop


@dataclass
class ScriptRank:
    """One rank's process in one attempt."""

    slot: int
    gpu: int | None
    popen: subprocess.Popen
    stacks_path: str
    error_path: str  # TORCHELASTIC_ERROR_FILE
    readers: list[StreamReader]
    children: set[int] = field(default_factory=set)  # pids seen under it (workers, compilers)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def vitals_path(self) -> str:
        """Where the rank writes its signs of life (ddptui/contract/observe/vitals.py)."""
        return vitals_path(self.stacks_path)

    @property
    def phases_path(self) -> str:
        """Where its step clock writes its latest window (ddptui/rank/telemetry/instrument.py)."""
        return phases_path(self.stacks_path)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def adopted(self) -> bool:
        """Started by the script's launcher, not by ddptui: not its process group's leader."""
        return isinstance(self.popen, Adopted)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to the rank and what it started (its group; an adopted rank's own children)."""
        if not self.adopted:
            _killpg(self.pid, sig)
            return
        try:
            children = psutil.Process(self.pid).children(True)
        except psutil.Error:
            children = []
        self.popen.send_signal(sig)
        for c in children:
            try:
                c.send_signal(sig)
            except psutil.Error:
                pass

    def traceback(self) -> list[str]:
        """The last lines of its traceback: the one torch's @record wrote to the error file,
        else the last in its output (stderr first, where Python writes them)."""
        recorded = recorded_error(self.error_path)
        if recorded:
            return recorded
        for reader in reversed(self.readers):  # stderr, then stdout
            lines = last_traceback(list(reader.tail))
            if lines:
                return lines
        return []

    def death(self) -> str:
        return ended_how(self.popen.returncode)

    def ended_with(self, text: str) -> str:
        """How it ended, then why (once: a signal's cause already starts with it). An exit
        code is the script's own (its argparse's 2 is not ddptui's usage error): said so."""
        death = self.death()
        if text.startswith(death):
            return text
        return f"{death} (the script's own, passed on): {text}" if self.exit_code < 128 else \
            f"{death}: {text}"

    @property
    def exit_code(self) -> int:
        """Its exit code as a shell reports it (a signal n is 128 + n)."""
        code = self.popen.returncode
        if code is None:
            return EXIT_FAILED
        return 128 - code if code < 0 else code


def recorded_error(path: str) -> list[str]:
    """The exception torch's @record wrote (torchrun's TORCHELASTIC_ERROR_FILE) as traceback
    lines ending in `Type: message`, as Python prints one; none without a readable file."""
    try:
        with open(path) as f:
            message = (parse(f.read()) or {})["message"]
        callstack = message.get("extraInfo", {}).get("py_callstack", "") \
            if isinstance(message, dict) else ""
        text = message["message"] if isinstance(message, dict) else str(message)
    except (OSError, ValueError, KeyError, TypeError):
        return []
    lines = [line for line in callstack.splitlines() if line.strip()]
    if lines and lines[-1].strip() == text.strip():
        lines.pop()
    raised = [m for m in map(_FRAME.match, lines) if m]  # the last frame is where it raised
    where = f" ({os.path.basename(raised[-1][1])}:{raised[-1][2]})" if raised else ""
    return lines + [text.strip() + where]


class RankGroup:
    """start() every rank; signal(), end() them; ended() tells which have exited since."""

    def __init__(self, config: ScriptConfig, stem: str, echo: bool,
                 on_line: Callable[[int, str, bool], None]):
        self.config, self.stem, self.echo, self.on_line = config, stem, echo, on_line
        self.ranks: list[ScriptRank] = []
        self._reported: set[int] = set()
        # (when, signal, the slots it is for: None for all) for what is left
        self._deadlines: list[tuple[float, int, frozenset[int] | None]] = []
        self._grace = 0.0
        self.signalled = False
        self._log_dir: list[str] = []  # torchrun's --log-dir folder of this run, once made
        self._console = Console()  # every rank's lines go on whole

    def start(self, attempt: Attempt, ranks: str | None = None) -> None:
        """Every rank; a script that starts its own (config.launch) as its launcher alone.
        `ranks`: the run's rank socket, for a lone process that may start ranks of its own
        (every rank says there that it turns out to launch them)."""
        self.ranks, self._reported, self._deadlines = [], set(), []
        self.signalled = False  # ddptui sent the ranks a signal (else a launcher did)
        if self.config.launch:
            self.start_one(LAUNCHER, attempt, ranks=ranks)
            return
        for slot in range(self.config.world_size):
            self.start_one(slot, attempt, ranks=ranks if self.config.world_size == 1 else None,
                           door=ranks)

    def start_one(self, slot: int, attempt: Attempt, standby: bool = False,
                  ranks: str | None = None, door: str | None = None) -> ScriptRank:
        """Start the slot's process (`standby`: it waits in ddptui.init() for a join order);
        the slot's earlier processes stay listed, ended. `ranks`: the run's rank socket, for a
        process that may start ranks of its own (a script's launcher: slot LAUNCHER)."""
        gpu = self.config.gpus[slot] if self.config.gpus and slot >= 0 else None
        routing = self.config.routing
        folder = routing.attempt_dir(attempt.run_id, attempt.restart, self._log_dir)
        stacks = f"{self.stem}.{_name(slot)}.stacks"
        error = routing.error_file(slot, folder) or f"{self.stem}.rank{slot}.error.json"
        # The rank makes them: when it can answer, as it fails, as it trains.
        for path in (stacks, error, vitals_path(stacks), phases_path(stacks)):
            if os.path.exists(path):
                os.remove(path)
        rank = max(slot, 0)  # a launcher is started as a lone rank 0 would be
        env = rank_env(self.config, attempt, rank, stacks,
                       trace_prefix=trace_prefix(self.stem), error_file=error,
                       ranks=(ranks, self.stem) if ranks else None, door=door)
        if standby:
            env["DDPTUI_STANDBY"] = "1"
        pipes = [os.pipe(), os.pipe()]
        try:
            popen = subprocess.Popen(command(self.config, rank), env=env,
                                     stdin=subprocess.DEVNULL,
                                     stdout=pipes[0][1], stderr=pipes[1][1],
                                     start_new_session=True, close_fds=True)
        finally:
            os.close(pipes[0][1])
            os.close(pipes[1][1])
        started = ScriptRank(slot, gpu, popen, stacks, error, [])
        self._read(started, [(1, pipes[0][0]), (2, pipes[1][0])], folder)
        self.ranks.append(started)
        return started

    def _read(self, rank: ScriptRank, streams: list[tuple[int, int]], folder: str | None) -> None:
        """A reader for each (1 or 2, fd) of the rank's, into its .out file and on, by its slot
        at each line (a launcher found to be one keeps its readers)."""
        routes = self.config.routing.routes(max(rank.slot, 0), self.config.world_size, folder)
        name = _name(rank.slot)
        for stream, fd in streams:
            i = stream - 1
            route = routes[i]
            reader = StreamReader(fd, f"{self.stem}.{name}.out",
                                  route if self.echo else Route(False, None, route.file),
                                  stream, self.echo and os.isatty(stream),
                                  lambda text, final, r=rank: self.on_line(r.slot, text, final),
                                  f"{name}-{('stdout', 'stderr')[i]}", self._console)
            reader.start()
            rank.readers.append(reader)
        # stdout first, whichever of an adopted rank's streams came in first: its traceback is
        # looked for in stderr before stdout
        rank.readers.sort(key=lambda reader: reader.echo)

    def adopt(self, hello: dict, fd: int) -> tuple[ScriptRank, bool]:
        """A process the launcher started joined a process group as rank hello["rank"]: its
        stream `fd` (hello["stream"]) is read as a rank's. (The rank, whether it is new.)"""
        slot = hello["rank"]
        r = next((r for r in self.ranks if r.pid == hello["pid"] and r.slot == slot), None)
        new = r is None
        if new:
            gpu = hello["gpu"]
            if gpu is None and self.config.gpus:  # not on CUDA yet: the k-th visible, by custom
                gpu = self.config.gpus[slot % len(self.config.gpus)]
            r = ScriptRank(slot, gpu, Adopted(hello["pid"]), f"{self.stem}.rank{slot}.stacks",
                           f"{self.stem}.rank{slot}.error.json", [])
            self.ranks.append(r)
        self._read(r, [(hello["stream"], fd)], None)
        return r, new

    @property
    def launcher(self) -> ScriptRank | None:
        return next((r for r in self.ranks if r.slot == LAUNCHER), None)

    def alive(self) -> list[ScriptRank]:
        return [r for r in self.ranks if r.alive]

    def ended(self) -> list[ScriptRank]:
        """Ranks that exited since the last call, once their output has been read to the end.
        What a failed rank leaves behind (its DataLoader workers) is killed first: they hold
        its output open, and notice their parent's death only after up to 5 s, which a
        survivor's recovery waited for."""
        done = []
        for r in self.ranks:
            if r.pid not in self._reported and not r.alive:
                if r.popen.returncode != 0 and not r.adopted:
                    _killpg(r.pid, signal.SIGKILL)
                until = time.monotonic() + 2.0
                for reader in r.readers:  # the last lines (a traceback) before the verdict
                    reader.join(max(0.0, until - time.monotonic()))
                self._reported.add(r.pid)
                done.append(r)
        return done

    def signal(self, sig: int) -> None:
        """Send `sig` to every live rank's process group (itself and its children); a
        launcher's ranks are in its group, unless they made sessions of their own."""
        self.signalled = True
        launcher = self.launcher
        for r in self.alive():
            if not r.adopted:
                _killpg(r.pid, sig)
            # setsid made the launcher its group's leader: a rank in another group has a session
            # of its own (a torchrun's), and gets the signal itself
            elif launcher is None or _group_of(r.pid) != launcher.pid:
                r.popen.send_signal(sig)

    def end_within(self, sig: int | None, grace: float, hung: set[int] = frozenset()) -> None:
        """As torchrun ends them: `sig` to every rank's group now (None: they were asked to stop
        by a command, and SIGINT follows at half the grace period), SIGKILL to what is left at
        its end (escalate() sends what is due). The `hung` slots (stalled, or waiting on one)
        cannot end by themselves: SIGKILL after HUNG_GRACE_S at most. Armed even where every
        rank seems gone: one may have ended between the caller's look and this one."""
        now, self._grace = time.monotonic(), grace
        if sig is None:
            self._deadlines = [(now + grace / 2, signal.SIGINT, None),
                               (now + grace, signal.SIGKILL, None)]
        else:
            self.signal(sig)
            self._deadlines = [(now + grace, signal.SIGKILL, None)]
        if hung and grace > HUNG_GRACE_S:
            self._deadlines.append((now + HUNG_GRACE_S, signal.SIGKILL, frozenset(hung)))
            self._deadlines.sort(key=lambda d: d[0])

    def escalate(self, say: Callable[..., None]) -> None:
        while self._deadlines and time.monotonic() >= self._deadlines[0][0] and self.alive():
            _, sig, slots = self._deadlines.pop(0)
            if slots is not None:
                left = [r for r in self.alive() if r.slot in slots]
                if left:
                    say(f"{count(len(left), 'hung rank')} ({', '.join(str(r.slot) for r in left)})"
                        f" killed after {HUNG_GRACE_S:g} s: a stalled rank cannot end by itself",
                        "warning")
                for r in left:
                    r.kill()
            elif sig == signal.SIGKILL:
                say(f"ranks did not end within --grace {self._grace:g} s: killing them",
                    "warning")
                self.end(None, 0)
            else:
                say("ranks did not end their loop: SIGINT to every rank", "warning")
                self.signal(sig)

    def scan_children(self) -> None:
        for r in self.alive():
            try:
                r.children |= {c.pid for c in psutil.Process(r.pid).children(True)}
            except psutil.Error:
                pass

    def pids(self) -> set[int]:
        return {r.pid for r in self.ranks} | {c for r in self.ranks for c in r.children}

    def end(self, first: int | None, grace: float) -> None:
        """`first` (SIGINT or SIGTERM) to every rank's group, SIGKILL after `grace` seconds to
        whatever of each group is left, then to any child that left its group."""
        self.scan_children()
        self.signalled = True
        if first is not None:
            self.signal(first)
        deadline = time.monotonic() + (grace if first is not None else 0)
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        for r in self.ranks:
            if not r.adopted:
                _killpg(r.pid, signal.SIGKILL)  # its group, even once the rank itself is gone
            if r.alive:
                r.kill()
            try:  # SIGKILLed: a process in the kernel's uninterruptible sleep holds no way out
                r.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        strays = []
        for pid in {c for r in self.ranks for c in r.children}:
            try:
                strays.append(psutil.Process(pid))
                strays[-1].kill()
            except psutil.Error:
                pass
        psutil.wait_procs(strays, timeout=3)


def _name(slot: int) -> str:
    """The slot's name in its files (<stem>.rank0.out, <stem>.launcher.out)."""
    return "launcher" if slot == LAUNCHER else f"rank{slot}"


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # setsid made the rank its group's leader: group id = its pid
    except (ProcessLookupError, PermissionError):
        pass
