"""A run with a process of its own and the dashboards on it: `ddptui run --detach`, then
`ddptui attach`'s dashboard in Pilot (the run so far, live steps, a key, d, q + y), two viewers
at once, and a socket no one else may use."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest

from ddptui.contract.socket.viewer import Viewer
from ddptui.contract.socket.viewers import Refused, frame, listen
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.snapshot import dump
from ddptui.dashboard.background import connect
from ddptui.dashboard.view.app import DashboardApp
from ddptui.dashboard.view.screens.confirm import ConfirmQuit
from ddptui.dashboard.view.widgets.tables import EpochTable
from tests.helpers.runs import (
    TINY,
    assert_gone,
    ddptui,
    detached,
    events,
    run_pids,
    viewer_lines,
    wait_for_event,
)
from tests.helpers.screens import until


async def test_attach_shows_the_run_so_far_and_live_and_its_keys_act_once_for_every_viewer(
        env, tmp_path):
    log = tmp_path / "bg.jsonl"
    pid, path = detached(env, log)
    pids = run_pids(log) | {pid}
    try:
        wait_for_event(log, lambda e: e["kind"] == "epoch" and e["rank"] == 0, 90)
        other = connect(path)  # a second dashboard, watching the same run
        other.start()
        app = DashboardApp(connect(path))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.5)
            # The run so far: the epoch that ended before this dashboard came, and the events
            # of the launch.
            epochs = app.query_one(EpochTable)
            assert epochs.row_count >= 1 and str(epochs.get_row_at(0)[0]).startswith("0")
            assert any(line.startswith("first step") for line in viewer_lines(app.source))
            # ... and live: the steps go on.
            step = app.source.state.view().ranks[0].global_step
            await until(pilot, lambda: app.source.state.view().ranks[0].global_step > step,
                        "live steps")

            await pilot.press("down", "s")  # rank 1 leaves the world
            await until(pilot, lambda: any(e.get("generation") and e["ranks"] == [0]
                                           for e in events(log, "world")), "a world of rank 0")
            for viewer in (app.source, other):  # both saw it, once
                await until(pilot, lambda v=viewer: "world: 1 rank [0]" in " ".join(viewer_lines(v)),
                            "the change said")
                assert sum(line.startswith("world: 1 rank [0]") for line in viewer_lines(viewer)) == 1
            await pilot.press("d")  # this dashboard leaves; the run goes on
            await pilot.pause()
        assert app.detached
        assert psutil.pid_exists(pid) and not other.done.is_set()
        step = events(log, "step")[-1]["global_step"]
        wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step, 60)

        app = DashboardApp(connect(path))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, ConfirmQuit), "q asking")
            await pilot.press("y")
            await until(pilot, lambda: app.closing, "the close", 90)  # once the run has ended
        assert app.source.exit_code == 130 and app.return_value == 130
        assert events(log, "run")[-1]["status"] == "interrupted"
        assert other.done.wait(10) and other.exit_code == 130  # the other one saw the end
        assert_gone(pids)
        assert not os.path.exists(path)
    finally:
        for p in pids:
            if psutil.pid_exists(p):
                os.kill(p, 9)


async def test_q_asked_as_the_run_ends_by_itself_quits_with_the_runs_code(env, tmp_path):
    """q pressed while the run is live asks "End the run?"; the run then ends by itself: the
    question is moot and the dashboard exits with the run's code (it stayed on DONE, asking,
    after a script's run on a GPU, 1 x H200)."""
    log = tmp_path / "ends.jsonl"
    pid, path = detached(env, log, epochs=40)
    pids = run_pids(log) | {pid}
    try:
        app = DashboardApp(connect(path))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("q")
            await until(pilot, lambda: isinstance(app.screen, ConfirmQuit), "q asking")
            await until(pilot, lambda: app.closing, "the close once the run is done", 120)
        assert app.return_value == 0 == app.source.exit_code
        assert events(log, "run")[-1]["status"] == "done"
        assert_gone(pids)
    finally:
        for p in pids:
            if psutil.pid_exists(p):
                os.kill(p, 9)


async def test_a_crash_of_the_dashboard_leaves_the_run_going_for_another(env, tmp_path,
                                                                        monkeypatch):
    log = tmp_path / "crash.jsonl"
    pid, path = detached(env, log)
    pids = run_pids(log) | {pid}
    try:
        app = DashboardApp(connect(path))

        def broken_show(view, selected, refit=False, final=False):
            raise RuntimeError("a widget bug")

        with pytest.raises(RuntimeError, match="a widget bug"):
            async with app.run_test(size=(120, 40)) as pilot:
                monkeypatch.setattr(app.rank_table, "show", broken_show)
                await until(pilot, lambda: app.crashed, "the crash")
        assert app.crashed and not app.source.done.is_set()
        app.source.close()
        step = events(log, "step")[-1]["global_step"]
        wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step, 60)
        again = connect(path)  # the next dashboard finds it as it was
        assert again.state.view().status == "running"
        again.stop(code=143)
        again.start()
        assert again.done.wait(90) and again.exit_code == 143
        assert_gone(pids)
    finally:
        for p in pids:
            if psutil.pid_exists(p):
                os.kill(p, 9)


def test_the_run_process_killed_ends_every_rank_and_its_dashboards_say_so(env, tmp_path):
    log = tmp_path / "k9.jsonl"
    pid, path = detached(env, log)
    pids = run_pids(log) | {pid}
    viewer = connect(path)
    viewer.start()
    os.kill(pid, 9)
    assert viewer.done.wait(30) and viewer.lost and viewer.exit_code is None
    assert "lost the run's process" in " ".join(viewer_lines(viewer))
    assert_gone(pids, timeout=60)  # the ranks watch their parent


def test_a_socket_others_could_use_is_refused_and_messages_are_checked(env, tmp_path):
    # A runtime folder another user could reach but for its own mode (the tests' cache is under
    # pytest's 0700 folder).
    runtime = tempfile.mkdtemp(prefix="ddptui-rt-", dir="/tmp")
    os.chmod(runtime, 0o755)
    env = dict(env, XDG_RUNTIME_DIR=runtime)
    log = tmp_path / "sec.jsonl"
    pid, path = detached(env, log)
    pids = run_pids(log) | {pid}
    folder = os.path.dirname(path)
    watcher = connect(path)  # what a dashboard's events pane shows
    watcher.start()
    try:
        # Another user of the machine: the folder (0700) keeps it out; with the folder and the
        # socket opened to all, the run still refuses it (the kernel names its user).
        assert os.stat(folder).st_mode & 0o777 == 0o700 and os.stat(path).st_mode & 0o777 == 0o600
        assert _as_nobody(path) == "PermissionError"
        os.chmod(folder, 0o755)
        os.chmod(path, 0o666)
        assert _as_nobody(path) == "closed"
        _said(watcher, "warning: refused a dashboard of user 65534")
        # A socket others may use is not trusted either: attach refuses it, in one line.
        os.chmod(folder, 0o700)
        r = ddptui(["attach", log.stem], env, tmp_path)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and \
            f"{path} is not this user's own (owner 0, mode 0o666)" in r.stderr, r.stderr
        with pytest.raises(Refused):
            Viewer(path)
        os.chmod(path, 0o600)

        # Messages that are not orders are dropped and said; one over the bound ends that
        # connection alone; the run goes on.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"not json\n" + frame({"op": "rm -rf"}) + frame({"op": "kill_rank",
                                                                        "rank": "1"}))
            for why in ("not a JSON object", "unknown op 'rm -rf'", "kill_rank: bad rank"):
                _said(watcher, f"warning: a dashboard's message was dropped: {why} "
                               f"(dashboard pid {os.getpid()})")
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(b"{" + b" " * (1 << 17))
            s.settimeout(30)
            with contextlib.suppress(ConnectionResetError):  # unread bytes: a reset, not a FIN
                while s.recv(1 << 16):  # the snapshot, then the end of this connection
                    pass
        step = events(log, "step")[-1]["global_step"]
        wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step, 60)
        assert not [e for e in events(log, "rank") if e.get("state") in ("stopped", "crashed")]
    finally:
        os.chmod(folder, 0o700)
        os.kill(pid, 15)
        assert_gone(pids, timeout=60)


def _said(viewer: Viewer, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in viewer_lines(viewer):
        assert time.monotonic() < deadline, f"never said: {text}\n{viewer_lines(viewer)[-10:]}"
        time.sleep(0.2)


def _as_nobody(path: str) -> str:
    """Connect to `path` as user 65534 from a child process: what came of it."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.close(read)
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.settimeout(10)
            result = "closed" if s.recv(1 << 16) == b"" else "served"
        except OSError as e:
            result = type(e).__name__
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        result = f.read()
    os.waitpid(child, 0)
    return result


def test_attach_names_what_it_cannot_reach(env, tmp_path):
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path))  # the other tests' runs are not ours here
    r = ddptui(["attach"], env, tmp_path)
    assert r.returncode == 2 and r.stderr == ("ddptui: error: no run of yours is running on this "
                                              "machine (ddptui ls lists them)\n")
    r = ddptui(["attach", "x", "--listen", "127.0.0.1:1"], env, tmp_path)
    assert r.returncode == 2 and "not both" in r.stderr
    r = ddptui(["run", *TINY, "--detach", "--headless"], env, tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("ddptui: error: --detach and --headless")


def test_the_changes_that_come_with_the_hello_are_taken(tmp_path):
    """The run's first events often come in the same read as its hello (a dashboard that
    connects as the run starts): they were dropped, and the screen never knew the run began."""
    path = str(tmp_path / "run.sock")
    server = listen(path)
    started = {"t": time.time(), "kind": "run", "rank": -1, "status": "started", "model": "m"}

    def serve() -> None:
        conn, _ = server.accept()
        conn.sendall(frame({"type": "hello", "name": "x", "pid": os.getpid(), "log": "x.jsonl",
                            "snapshot": dump(RunState())})
                     + frame({"type": "event", "ev": started})
                     + frame({"type": "end", "exit_code": 0}))
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    viewer = Viewer(path)
    viewer.start()
    assert viewer.done.wait(10) and viewer.exit_code == 0 and not viewer.lost
    assert viewer.state.started_t == started["t"] and viewer.state.meta["model"] == "m"
    server.close()


def test_a_run_process_gone_while_its_socket_stays_open_ends_the_dashboard(tmp_path):
    """Another process holds the run's end of the socket (it outlived the run's process): no
    `end` and no EOF ever come. The dashboard sees the run's process gone and takes the run's
    end from its log (seen once on a GPU: DONE on screen, and q asked to end a finished run).
    The run's process is this one's child, left a zombie, as `ddptui run`'s is until it exits."""
    path, log = str(tmp_path / "run.sock"), tmp_path / "run.jsonl"
    log.write_text(json.dumps({"t": time.time(), "kind": "run", "rank": -1, "status": "done",
                               "exit_code": 0}) + "\n")
    server = listen(path)
    run_process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    held = []

    def serve() -> None:
        conn, _ = server.accept()
        held.append(conn)  # never closed while the viewer waits: as if another process held it
        conn.sendall(frame({"type": "hello", "name": "x", "pid": run_process.pid,
                            "log": str(log), "snapshot": dump(RunState())}))

    threading.Thread(target=serve, daemon=True).start()
    viewer = Viewer(path)
    viewer.start()
    assert not viewer.done.wait(0.5)
    while psutil.Process(run_process.pid).status() != psutil.STATUS_ZOMBIE:  # ended, not reaped
        time.sleep(0.05)
    assert viewer.done.wait(30) and viewer.exit_code == 0 and not viewer.lost
    run_process.wait()
    assert "the run's process ended; its log says how" in viewer_lines(viewer)
    server.close()
    held[0].close()
