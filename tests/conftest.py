"""The fixtures every test may take: the session's data cache, the environment of a run,
ddptui's main() in the test's process, a real one-host SLURM, and the end of whatever a failed
test left going; helpers live in tests/helpers/."""

from __future__ import annotations

import os
from collections.abc import Callable

import psutil
import pytest

from tests.helpers.runs import REPORT_KEY, describe_pid, helper_of, run_env
from tests.helpers.slurm import OneHostSlurm
from tests.helpers.slurm import missing as slurm_missing


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory, worker_id) -> str:
    """The data cache of this test run, shared by xdist's workers: the shapes set is generated
    once per run, not once per worker (3 CPU-s each; generation renames a finished folder into
    place, so workers may race for it)."""
    base = tmp_path_factory.getbasetemp()
    path = (base if worker_id == "master" else base.parent) / "cache"
    path.mkdir(exist_ok=True)
    return str(path)


@pytest.fixture
def env(cache_dir) -> dict:
    return run_env(cache_dir)


@pytest.fixture
def keyed_env(env) -> dict:
    """A run's environment with the attach channel's key."""
    return dict(env, DDPTUI_AUTHKEY=REPORT_KEY, OMP_NUM_THREADS="1")


@pytest.fixture
def cli_main(tmp_path, cache_dir, monkeypatch, capsys) -> Callable[[list[str]], tuple[int, list[str]]]:
    """ddptui's main() in this process, in tmp_path: (exit code, stderr lines). For checks that
    end before any process starts (a process each cost a second of the suite)."""
    from ddptui.cli import main
    from ddptui.contract import bytecode

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


@pytest.fixture(autouse=True)
def _end_what_a_failed_test_left(monkeypatch):
    """A test that fails half-way leaves its run going (a Supervisor's or a ScriptRun's thread
    and ranks, a ddptui subprocess): end them so that they do not load the tests after it. Tests
    that check for leftovers do so themselves, with assert_gone."""
    from ddptui.run.builtin.supervisor import Supervisor
    from ddptui.run.script.run import ScriptRun

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
    left = [p for p in me.children(recursive=True) if not helper_of(me, p)]
    for p in left:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)


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
        return [describe_pid(p.pid) for p in psutil.Process().children() if p.pid not in before]

    yield adopted
    libc.prctl(36, 0, 0, 0, 0)
    for p in psutil.Process().children():
        if p.pid not in before:
            try:
                p.kill()
            except psutil.Error:
                pass
    psutil.wait_procs([p for p in psutil.Process().children() if p.pid not in before], timeout=10)


@pytest.fixture
def slurm(tmp_path_factory):
    """A real SLURM on this host for the test (tests/helpers/slurm.py). Where it cannot run the
    test is skipped and says why; on CI, which installs it (.ci/run), it fails instead."""
    why = slurm_missing()
    if why:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"no real SLURM: {why}")
    cluster = OneHostSlurm(str(tmp_path_factory.mktemp("slurm")))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def script_env(env, monkeypatch):
    """The test environment in this process's own: a ScriptRun started here hands it on."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
