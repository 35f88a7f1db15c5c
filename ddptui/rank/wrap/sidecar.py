"""The watcher beside a rank under `python -m ddptui.wrap`, in a process of its own: it holds the
link to `ddptui attach` and does from outside the rank what must work while the rank is stuck.

It forwards what the rank's own threads send (its output, loss, exception: ddptui/rank/wrap/rankwatch.py),
samples the rank's process and GPU, and answers attach's `t` (the rank's faulthandler writes
its stacks on a signal, torch's NCCL watchdog dumps the flight recorder through its pipe) and
`k`: none of that needs the rank's Python, which C code holding the GIL stops altogether.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable

import psutil

from ddptui.contract.channel import load_key, parse_address
from ddptui.contract.gpu import DeviceSampler
from ddptui.contract.observe.endings import ended_how
from ddptui.contract.observe.flight import DUMP_WAIT_S, FlightDumps, compact, summary
from ddptui.contract.observe.stacks import NO_HANDLER, StackRequests, innermost
from ddptui.contract.observe.vitals import read_vitals
from ddptui.contract.protocol import events
from ddptui.contract.protocol.codec import decode
from ddptui.contract.protocol.orders import AskStacks, EndWrapped, KillWrapped
from ddptui.rank.elastic.lifeline import die_with_parent
from ddptui.rank.telemetry.remote import RemoteLink, node_name
from ddptui.rank.wrap import relay

SAMPLE_EVERY_S = 1.0  # its process figures over the link (attach: unreachable after 5 s without)
TERM_GRACE_S = 10.0  # after a SIGTERM of its own, how long it waits for the rank to end
RANK_GONE = signal.SIGUSR2  # the kernel's word that the rank died (PR_SET_PDEATHSIG)


class Sidecar:
    def __init__(self, args: argparse.Namespace):
        self.args, self.rank, self.pid = args, args.rank, args.pid
        address, key, node = parse_address(args.report, "DDPTUI_REPORT"), load_key()[0], node_name()
        self.link = RemoteLink(address, key, node, lambda text: print(
            f"ddptui.wrap: rank {args.rank}: {text}", file=sys.stderr),
            relay=relay.start(args.report, address, key, node))
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._sampled = threading.Event()
        self.device = DeviceSampler(args.rank, self.emit, lambda text: self.emit(
            events.Notice(rank=self.rank, level="warning", text=text)), args.gpu)
        self.flight = FlightDumps(args.flight) if args.flight else None
        self._asking = threading.Lock()  # one request at a time: they share the stacks file
        self.gone = threading.Event()  # the rank died, or closed its end of the pipe
        self.gone_at = 0.0
        # The kernel's word, as its signal handler notes it: a handler that set `gone` itself
        # could find its lock held by the main thread it interrupted, and wait on it for ever.
        self.signalled_gone: float | None = None
        self.ended: events.Rank | None = None  # the rank's own word of its end, passed on
        self.terminated: float | None = None  # when a SIGTERM came (its launcher's, mostly)
        self.killed_at: float | None = None  # when k's SIGKILL was sent
        self.end_grace: float | None = None  # K's grace, once K asked this rank to end

    def emit(self, ev: events.Event) -> None:
        self.put(ev)

    def put(self, ev: events.Event) -> None:
        with self._lock:
            self.link.put(ev)

    def run(self, lines) -> None:
        """Until the rank is gone: then how it ended, if it could not say so itself, and what is
        buffered are sent. Its end comes as its end of the pipe closing or, where a process it
        forked holds that open, as the kernel's signal (RANK_GONE)."""
        self.device.start()
        for target, name in ((self._sample, "sampler"), (self._commands, "commands")):
            threading.Thread(target=target, name=f"ddptui-sidecar-{name}", daemon=True).start()
        threading.Thread(target=self._forward, args=(lines,), name="ddptui-sidecar-events",
                         daemon=True).start()
        while not self.gone.wait(0.5):  # the rank's end: its pipe closed, or the kernel's word
            if self.signalled_gone is not None:
                self.rank_gone(self.signalled_gone)
            if self.terminated and time.monotonic() - self.terminated > TERM_GRACE_S:
                break  # the rank outlived the signal: this process goes as it was told
        if self.ended is None:
            code = exit_status(self.pid)
            if code is not None or not psutil.pid_exists(self.pid):
                # Dated when it died (k) or was seen to: the job's first failure is the
                # earliest, and a peer's error at its death comes a moment later.
                self.put(events.Rank(rank=self.rank, t=round(self.killed_at or self.gone_at, 3),
                                     **self.end_of(code)))
        self._halt.set()
        self._sampled.wait(SAMPLE_EVERY_S)  # the last sample: the rank waits for this process
        self.device.stop()
        self.link.close()

    def _forward(self, lines) -> None:
        for line in lines:
            ev = decode(line)
            if ev is None:
                continue
            if isinstance(ev, events.Rank) and ev.state in ("done", "crashed"):
                self.ended = ev
            self.put(ev)
        self.rank_gone()

    def rank_gone(self, at: float | None = None) -> None:
        if not self.gone.is_set():
            self.gone_at = at or time.time()
            self.gone.set()

    def end_of(self, code: int | None) -> dict:
        """The fields of the `rank` event of an end the rank did not report: its exit code or
        signal, and who sent it where known."""
        fields = {"state": "done" if code == 0 else "crashed", "pid": self.pid}
        return {**fields, **({"exit_code": code} if code is not None else {}),
                **({} if code == 0 else {"reason": self._how(code)})}

    def _how(self, code: int | None) -> str:
        """How the rank ended (`code`: its exit code, None where its launcher reaped it first),
        and who ended it where that is known: K, k, its launcher, the kernel's OOM killer."""
        how = ended_how(code) if code is not None else "ended"
        if self.end_grace is not None and code in (-signal.SIGTERM, -signal.SIGKILL, None):
            if self.killed_at:
                return f"killed by SIGKILL (K, still there {self.end_grace:g} s after its SIGTERM)"
            if code is None:
                return "ended on SIGTERM (K); its launcher took its exit status first"
            return f"{how} (K)"
        if self.killed_at and code in (-signal.SIGKILL, None):
            return "killed by SIGKILL (k)"
        if self.terminated and code in (-signal.SIGTERM, -signal.SIGKILL):
            return how + " from its launcher"  # torchrun and srun signal every process of the rank
        if self.terminated and code is None:
            return "ended on its launcher's SIGTERM"
        if code == -signal.SIGKILL and _memory_short():
            return how + ": memory was nearly full, likely the kernel's OOM killer"
        if code is None:  # srun's step daemon reaps at once
            return how + "; its launcher took its exit status first"
        return how

    def _sample(self) -> None:
        """The rank's process figures at once (a short rank may end within the first period),
        every SAMPLE_EVERY_S after, and once more when its end of the pipe closes."""
        try:
            rank = psutil.Process(self.pid)
            times = rank.cpu_times()
            since = max(time.time() - rank.create_time(), 1e-3)
            self._send_sample(rank, 100.0 * (times.user + times.system) / since)
            rank.cpu_percent()  # the periodic readings are over each period from here
            while not self._halt.wait(SAMPLE_EVERY_S):
                self._send_sample(rank, rank.cpu_percent())
            self._send_sample(rank, rank.cpu_percent())
        except psutil.Error:  # the rank is gone: its end of the pipe closes too
            pass
        finally:
            self._sampled.set()

    def _send_sample(self, rank: psutil.Process, cpu_percent: float) -> None:
        vitals = read_vitals(self.args.vitals) if self.args.vitals else None
        with rank.oneshot():
            self.emit(events.Process(rank=self.rank, pid=self.pid, status=rank.status(),
                                     cpu_percent=cpu_percent, rss=rank.memory_info().rss >> 20,
                                     opt_steps=vitals[0] if vitals else None,
                                     moves=vitals[1] if vitals else None))

    def _commands(self) -> None:
        try:
            while True:
                cmd = self.link.inbox.recv()
                if isinstance(cmd, AskStacks):
                    threading.Thread(target=self._stacks, daemon=True,
                                     name="ddptui-sidecar-stacks").start()
                elif isinstance(cmd, KillWrapped):  # k in attach: the launcher does the rest
                    self.killed_at = time.time()
                    os.kill(self.pid, signal.SIGKILL)
                elif isinstance(cmd, EndWrapped):  # K: the whole job ends
                    grace = 10.0 if cmd.grace is None else cmd.grace
                    threading.Thread(target=self._end, args=(grace,), name="ddptui-sidecar-end",
                                     daemon=True).start()
        except (EOFError, OSError):
            pass

    def _end(self, grace: float) -> None:
        """SIGTERM, as a launcher ends its workers, then SIGKILL if the rank is still there."""
        self.end_grace = grace
        os.kill(self.pid, signal.SIGTERM)
        if not self.gone.wait(grace):
            self.killed_at = time.time()
            os.kill(self.pid, signal.SIGKILL)

    def _stacks(self) -> None:
        """The rank's stacks (faulthandler answers from C, whatever its Python is doing), then
        its flight recorder's dump once torch's watchdog has written it."""
        with self._asking:
            self._ask_stacks()

    def _ask_stacks(self) -> None:
        requests = StackRequests()
        asked = requests.ask(self.rank, self.pid, self.args.stacks, time.monotonic(),
                             self.args.signal)
        stacks = _wait(lambda: requests.collect(time.monotonic())) if asked else None
        # The rank's number is the event's: the events pane puts "rank N: " before the text.
        where = innermost(stacks) if stacks else ""
        self.emit(events.Stacks(rank=self.rank, level="info" if stacks else "warning",
                                text=(f"is in {where}" if where else "stacks taken") if stacks
                                else f"no Python stacks: {'no answer' if asked else NO_HANDLER}",
                                stacks_of=self.rank, stacks=stacks or ""))
        if self.flight is None or not self.flight.ask(self.rank, time.monotonic()):
            return
        trace = _wait(lambda: self.flight.collect(time.monotonic()), DUMP_WAIT_S + 1)
        nccl = summary(trace)
        if nccl is not None:
            self.emit(events.Stacks(rank=self.rank, level="info", text=nccl, stacks_of=self.rank,
                                    stacks=f"{nccl}\n\n{stacks}" if stacks else nccl,
                                    flight=compact(trace)))


def exit_status(pid: int, within: float = 0.5) -> int | None:
    """A dead rank's exit code (negative: its signal) while it waits for its launcher to reap
    it: the wait status in /proc/PID/stat's last field (Linux 3.5+); None once reaped."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        if fields[0] in ("Z", "X"):
            status = int(fields[-1])
            return -(status & 0x7F) if status & 0x7F else status >> 8
        time.sleep(0.002)  # still exiting: its open files close before it is a zombie
    return None


def _memory_short() -> bool:
    """Whether the machine is nearly out of memory, as when the OOM killer chooses a rank."""
    return psutil.virtual_memory().percent > 95


def _wait(collect, seconds: float = 15.0):
    """What a StackRequests or FlightDumps collect() gives for the one request made."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _, answer in collect():
            return answer
        time.sleep(0.1)
    return None


def noted_gone(sidecar) -> Callable[[int, object], None]:
    """RANK_GONE's handler: it notes the time and nothing else. The kernel's word comes once per
    thread of the rank that ends, so twice at once at times; a handler that set `gone` itself
    waited for ever on the lock of the handler (or the wait) it interrupted."""
    def gone(signum, frame) -> None:
        sidecar.signalled_gone = sidecar.signalled_gone or time.time()

    return gone


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ddptui.rank.wrap.sidecar", description=__doc__)
    p.add_argument("--report", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--gpu", type=int, default=None)
    p.add_argument("--stacks", required=True, help="the file the rank's faulthandler writes")
    p.add_argument("--signal", type=int, default=int(signal.SIGUSR1))
    p.add_argument("--vitals", default=None, help="the file the rank keeps its vitals in")
    p.add_argument("--flight", default=None, help="the flight recorder's dump prefix")
    p.add_argument("--events", type=int, required=True, help="the fd the rank writes events to")
    p.add_argument("--scratch", required=True,
                   help="the rank's folder of stacks and dumps, removed when the rank is gone")
    args = p.parse_args(argv)

    sidecar = Sidecar(args)

    def terminated(signum, frame) -> None:  # a launcher's SIGTERM goes to the rank's group
        sidecar.terminated = time.monotonic()

    signal.signal(signal.SIGTERM, terminated)  # the rank's end is said first
    signal.signal(RANK_GONE, noted_gone(sidecar))
    die_with_parent(RANK_GONE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the rank's to handle
    try:
        with os.fdopen(args.events, encoding="utf-8", errors="replace") as lines:
            sidecar.run(lines)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
