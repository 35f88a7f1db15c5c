"""Running ddptui as a user would and reading what it leaves: the repository's paths, a
run's JSONL events, its processes, and proof that none of them is left behind."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import psutil

from ddptui.contract.protocol.codec import event_of, parse
from ddptui.contract.protocol.events import EVENTS, Notice
from ddptui.run.builtin.helpers import is_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["tests.helpers.userpkg:tiny_cnn", "--data", "tests.helpers.userpkg:blobs",
        "--batch-size", "16", "--workers", "0"]


def run_config(*args: str, cpus: int = 2):
    """The RunConfig `ddptui run ARGS --cpus N` would give an in-process Supervisor."""
    from ddptui.contract.options.parser import Parser
    from ddptui.contract.options.training import add_training_options, config_from_args

    parser = Parser()
    add_training_options(parser)
    return config_from_args(parser.parse_args(list(args)), cpus=cpus)


REPORT_KEY = "test-key-0123456789"  # the attach channel's key of every test


def local_port() -> int:
    """A loopback port free now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_env(cache_dir: str) -> dict:
    """The environment of a ddptui started by a test: this checkout, the shared data cache, and
    a runtime folder of the tests' own (the runs' records for `ddptui ls`)."""
    e = dict(os.environ, DDPTUI_CACHE=cache_dir, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1",
             XDG_RUNTIME_DIR=os.path.join(cache_dir, "runtime"))
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


def ddptui(args: list[str], env: dict, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `ddptui ARGS` to completion (stdout is a pipe, so it runs headless)."""
    return subprocess.run([sys.executable, "-m", "ddptui", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def start_ddptui(args: list[str], env: dict, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddptui", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# A `message` and the kinds that are a line with facts beside it (a rank's stacks, input wait):
# a test asks for the events pane's lines as `message`, as they all were in earlier releases.
LINES = {name for name, cls in EVENTS.kinds.items() if issubclass(cls, Notice)}


def read_events(path: str) -> list[dict]:
    """A log's lines as JSON objects (a half-written last line is skipped)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [obj for obj in map(parse, f) if obj is not None]


def events(path, kind: str | None = None) -> list[dict]:
    """The log's events of `kind` (all without one), each decoded by ddptui's codec, which
    checks it against its class: every test that reads a log checks the protocol too, polling
    loops included."""
    evs = read_events(str(path))
    wrong = [e for e in evs if event_of(e) is None]
    assert not wrong, f"{path}: lines that are no event of contract/protocol/events.py: {wrong[:5]}"
    kinds = LINES if kind == "message" else {kind}
    return [e for e in evs if kind is None or e["kind"] in kinds]


def epoch_samples(path) -> dict[tuple[int, int], int]:
    """Samples each rank trained in each epoch, its rows' parts added up."""
    totals: dict[tuple[int, int], int] = {}
    for e in events(path, "epoch"):
        totals[e["rank"], e["epoch"]] = totals.get((e["rank"], e["epoch"]), 0) + e["samples"]
    return totals


def wait_for_event(path, predicate, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            for ev in read_events(str(path)):
                if predicate(ev):
                    return ev
        time.sleep(0.2)
    raise AssertionError(f"no matching event in {path} within {timeout} s")


_BORN: dict[int, float] = {}  # pid -> its process's start time when a test collected it


def run_pids(path) -> set[int]:
    """Every pid a run reported: ranks (rank events) and whatever they started since."""
    pids = {e["pid"] for e in read_events(str(path)) if e.get("pid")}
    for pid in list(pids):
        try:
            pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    for pid in pids:
        try:
            _BORN.setdefault(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            pass
    return pids


def rank_pids(path) -> set[int]:
    """The ranks' processes and whatever they started since, without the run's parent (a run
    driven in the test's own process: its other children are not the run's)."""
    ranks = {e["pid"] for e in read_events(str(path)) if e["rank"] >= 0 and e.get("pid")}
    return run_pids(path) & (ranks | _descendants(ranks))


def _descendants(pids: set[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            found |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    return found


def assert_stops_cleanly(run, log) -> None:
    """q on a script that opted in: every rank leaves its loop at one step and exits 0, the run
    says 130 (interrupted), and nothing of it is left."""
    pids = rank_pids(log)
    try:
        run.stop()
        assert run.wait(90) == 130
    finally:
        run.stop()
        run.stop()  # a second stop ends every process at once
        run.wait(30)
    ends = [(e["rank"], e["state"]) for e in read_events(str(log))
            if e["kind"] == "rank" and e.get("exit_code") is not None]
    assert sorted(ends) == [(0, "done"), (1, "done")]
    assert_gone(pids)


def assert_gone(pids: set[int], timeout: float = 30) -> None:
    """Every process ends; the timeout only keeps a leak from hanging the suite. An empty set
    proves nothing: the test saw no process to check."""
    assert pids, "no process to check: the test never saw the run's processes"
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _alive(p)}
        time.sleep(0.1)
    assert not alive, f"processes left behind: {[describe_pid(p) for p in alive]}"


def _alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        if pid in _BORN and p.create_time() != _BORN[pid]:
            return False  # the pid was reused by a process that is not ours
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def describe_pid(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:100]}"
    except psutil.Error:
        return str(pid)


def helper_of(me: psutil.Process, p: psutil.Process) -> bool:
    try:
        return p.ppid() == me.pid and is_helper(p)
    except psutil.Error:  # gone meanwhile
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def detached(env: dict, log, epochs: int = 500, stderr: list | None = None) -> tuple[int, str]:
    """A 2-rank CPU run started with --detach: its pid and socket, once it has stepped. Its
    steps are paced: nothing waits for it, so unpaced it took both cores from the tests beside.
    `stderr`: gets what the detaching process printed there."""
    r = ddptui(["run", "tests.helpers.userpkg:paced_cnn", *TINY[1:], "--cpus", "2", "--epochs",
                str(epochs), "--detach", "--log", str(log)], env, ROOT)
    assert r.returncode == 0, r.stderr
    if stderr is not None:
        stderr.append(r.stderr)
    said = re.fullmatch(r"ddptui: (\S+) runs in the background \(pid (\d+)\); ddptui attach "
                        r"\1 watches it again; log (\S+)\n", r.stdout)
    assert said and said[1] == log.stem and said[3] == str(log), r.stdout
    pid = int(said[2])
    wait_for_event(log, lambda e: e["kind"] == "step", 90)
    return pid, os.path.join(env["XDG_RUNTIME_DIR"], "ddptui", f"{pid}.sock")


def imported(text: str) -> set[str]:
    """The modules a process imported, from what PYTHONPROFILEIMPORTTIME=1 made it print."""
    return {line.rsplit("|", 1)[-1].strip() for line in text.splitlines()
            if line.startswith("import time:") and "|" in line}


def viewer_lines(viewer) -> list[str]:
    """The lines a Viewer's run state holds, oldest first."""
    return [text for _seq, _t, _level, text, _kind in viewer.state.lines_after(0)]
