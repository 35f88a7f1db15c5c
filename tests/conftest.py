"""Shared fixtures: a cached shapes dataset for the session, running ddptui as a user would,
reading its JSONL log, and proving that no process of a run is left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import pytest

from ddptui.contract.check import problems
from ddptui.contract.events import read_events
from ddptui.run.processes import is_helper
from ddptui.view.widgets.charts import Chart

# plotext chooses tick labels and colours in str-hash order: a chart's snapshot is the same
# from run to run only with a fixed hash seed (make test sets PYTHONHASHSEED=0).
fixed_hash = pytest.mark.skipif(bool(sys.flags.hash_randomization),
                                reason="needs PYTHONHASHSEED=0 (make test sets it)")


async def settle(pilot) -> None:
    """Play a replayed log to its end, then draw its final state, charts included, with the
    panels' heights and the events pane's scroll settled (snapshots are taken after this)."""
    app = pilot.app
    while not app.source.done.is_set():
        await pilot.pause(0.05)
    for _ in range(2):  # rows added change the panels' heights, and so the charts' size
        app.refresh_view()
        await pilot.pause(0.2)
    app.refresh_charts()
    app.events.scroll_end(animate=False)
    # The charts are built on threads and shown once built; a chart resized meanwhile builds
    # again. On a loaded machine that takes more than one pause.
    for _ in range(50):
        await app.workers.wait_for_complete()
        await pilot.pause(0.1)
        if all(chart.drawn for chart in app.query(Chart) if chart.display):
            break
    await pilot.wait_for_scheduled_animations()
    # A loaded machine may still be laying out (a table measures its columns when the app is
    # idle: a snapshot under `make test`'s three at a time caught the rank table mid-way): the
    # screen counts as drawn once two screenshots 0.2 s apart are the same.
    shot = None
    for _ in range(25):
        await pilot.pause(0.2)
        shot, last = app.export_screenshot(), shot
        if shot == last:
            break

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = ["--image-size", "32", "--batch-size", "16", "--workers", "1"]
TINY = ["tests.helpers.userpkg:tiny_cnn", "--data", "tests.helpers.userpkg:blobs",
        "--batch-size", "16", "--workers", "0"]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory, worker_id) -> str:
    """The data cache of this test run, shared by xdist's workers: the shapes set is generated
    once per run, not once per worker (3 CPU-s each; generation renames a finished folder into
    place, so workers may race for it)."""
    base = tmp_path_factory.getbasetemp()
    path = (base if worker_id == "master" else base.parent) / "cache"
    path.mkdir(exist_ok=True)
    return str(path)


def run_config(*args: str, cpus: int = 2):
    """The RunConfig `ddptui run ARGS --cpus N` would give an in-process Supervisor."""
    from trainer.options import Parser
    from trainer.parse import add_training_options, config_from_args

    parser = Parser()
    add_training_options(parser)
    return config_from_args(parser.parse_args(list(args)), cpus=cpus)


def run_env(cache_dir: str) -> dict:
    """The environment of a ddptui started by a test: this checkout, the shared data cache."""
    e = dict(os.environ, DDPTUI_CACHE=cache_dir, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    e.pop("CUDA_VISIBLE_DEVICES", None)
    return e


@pytest.fixture
def env(cache_dir) -> dict:
    return run_env(cache_dir)


@pytest.fixture
def cli_main(tmp_path, cache_dir, monkeypatch, capsys) -> Callable[[list[str]], tuple[int, list[str]]]:
    """ddptui's main() in this process, in tmp_path: (exit code, stderr lines). For checks that
    end before any process starts (a process each cost a second of the suite)."""
    from ddptui import bytecode
    from ddptui.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DDPTUI_CACHE", cache_dir)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(bytecode, "enable", lambda: None)  # no cache prefix for pytest itself

    def call(args: list[str]) -> tuple[int, list[str]]:
        try:
            code = main(args)
        except SystemExit as e:  # argparse's own errors
            code = e.code
        return code, capsys.readouterr().err.strip().splitlines()

    return call


def ddptui(args: list[str], env: dict, cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `ddptui ARGS` to completion (stdout is a pipe, so it runs headless)."""
    return subprocess.run([sys.executable, "-m", "ddptui", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def start_ddptui(args: list[str], env: dict, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddptui", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_CHECKED: dict[str, int] = {}  # log -> how many of its events fit the schema (logs only grow)


def events(path, kind: str | None = None) -> list[dict]:
    """The log's events of `kind` (all without one), each checked against the schema once:
    every test that reads a log checks the contract too, polling loops included."""
    evs = read_events(str(path))
    seen = _CHECKED.get(str(path), 0)
    seen = seen if seen <= len(evs) else 0  # a log written anew
    wrong = [(e, p) for e in evs[seen:] for p in problems(e)]
    assert not wrong, f"{path}: events that do not fit ddptui/contract/schema.py: {wrong[:5]}"
    _CHECKED[str(path)] = len(evs)
    return [e for e in evs if kind is None or e["kind"] == kind]


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
    """Every process ends; the timeout only keeps a leak from hanging the suite."""
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _alive(p)}
        time.sleep(0.1)
    assert not alive, f"processes left behind: {[_describe(p) for p in alive]}"


def _alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        if pid in _BORN and p.create_time() != _BORN[pid]:
            return False  # the pid was reused by a process that is not ours
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _describe(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:100]}"
    except psutil.Error:
        return str(pid)


@pytest.fixture(autouse=True)
def _end_what_a_failed_test_left(monkeypatch):
    """A test that fails half-way leaves its run going (a Supervisor's or a ScriptRun's thread
    and ranks, a ddptui subprocess): end them so that they do not load the tests after it. Tests
    that check for leftovers do so themselves, with assert_gone."""
    from ddptui.run.supervisor import Supervisor
    from ddptui.script.run import ScriptRun

    started = []
    for cls in (Supervisor, ScriptRun):
        monkeypatch.setattr(cls, "start", lambda run, start=cls.start: (started.append(run),
                                                                          start(run))[1])
    yield
    for sup in started:
        if not sup.done.is_set():
            sup.stop()
            sup.stop()  # the second stop ends every process at once
            sup.wait(30)
    me = psutil.Process()
    # multiprocessing's helpers serve every in-process run of this worker: the fork server's
    # preloaded torch is the point of it
    left = [p for p in me.children(recursive=True) if not _a_helper_of(me, p)]
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)


def _a_helper_of(me: psutil.Process, p: psutil.Process) -> bool:
    try:
        return p.ppid() == me.pid and is_helper(p)
    except psutil.Error:  # gone meanwhile
        return False


@pytest.fixture
def orphans():
    """While the test runs, processes orphaned by a ddptui subprocess are adopted by this one
    (PR_SET_CHILD_SUBREAPER) instead of PID 1, so the test can see what ddptui left behind the
    moment it returned: `orphans()` lists them. They are reaped afterwards."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    before = {p.pid for p in psutil.Process().children()}

    def adopted() -> list[str]:
        return [_describe(p.pid) for p in psutil.Process().children() if p.pid not in before]

    yield adopted
    libc.prctl(36, 0, 0, 0, 0)
    for p in psutil.Process().children():
        if p.pid not in before:
            try:
                p.kill()
            except psutil.Error:
                pass
    psutil.wait_procs([p for p in psutil.Process().children() if p.pid not in before], timeout=10)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
