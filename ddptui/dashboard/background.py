"""A run in a process of its own and the dashboards on it: `ddptui run` starts the run's process
(no terminal: a closed one does not end it) and watches it; `ddptui attach RUN` watches it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ddptui.contract.console import HeadlessConsole, print_verdict, summary
from ddptui.contract.options.errors import UsageError
from ddptui.contract.runs.registry import HOST_ENV, run_name
from ddptui.contract.runs.runtime_dir import FolderRefused, RuntimeDir, safe_name
from ddptui.contract.socket.viewer import Viewer
from ddptui.contract.socket.viewers import Refused
from ddptui.dashboard.web.tab_process import end_with_server, is_tab

READY_S = 120.0  # for the run's process to listen (it imports little before it does)
REAP_S = 10.0  # for the run's process to close, once a dashboard saw it end


class NotStarted(Exception):
    """The run's process ended before it listened: `code` and the lines it printed."""

    def __init__(self, code: int, said: list[str]):
        super().__init__(code)
        self.code, self.said = code, said


def launch(argv: list[str], log: str) -> tuple[subprocess.Popen, Viewer]:
    """Start `ddptui ARGV` as the run's own process, in a session of its own (no controlling
    terminal), its output in the user's runtime folder; returns once a viewer is connected to
    it. Ctrl-C meanwhile ends it: the run is not wanted."""
    out = f"{run_name(log)}.out"
    if not safe_name(out):
        raise UsageError(f"the log's name cannot name the run: {log!r} (--log FILE.jsonl)")
    try:
        folder = RuntimeDir()
    except FolderRefused as e:
        raise UsageError(str(e)) from None
    with folder, os.fdopen(folder.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "ddptui", *argv],
                                env={**os.environ, HOST_ENV: log}, stdin=subprocess.DEVNULL,
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _until_listening(proc, folder, out, time.monotonic() + READY_S)
            return proc, connect(folder.inside(f"{proc.pid}.sock"))
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise


def _until_listening(proc: subprocess.Popen, folder: RuntimeDir, out: str,
                     deadline: float) -> None:
    while True:
        try:
            folder.stat(f"{proc.pid}.sock")
            return
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            said = folder.read(out, 1 << 20).decode(errors="replace")
            raise NotStarted(proc.returncode, said.splitlines())
        if time.monotonic() > deadline:
            proc.kill()
            raise UsageError(f"the run's process did not start within {READY_S:.0f} s "
                             f"(its output: {os.path.join(folder.path, out)})")
        time.sleep(0.05)


def connect(path: str, read_only: bool = False) -> Viewer:
    """A viewer of the run at `path` (its socket may be bound and not yet listening)."""
    for _ in range(100):
        try:
            return Viewer(path, read_only)
        except ConnectionRefusedError:
            time.sleep(0.05)
    return Viewer(path, read_only)


def attach(pid: int, read_only: bool = False) -> Viewer:
    """A viewer of the run whose process is `pid`, through the user's runtime folder."""
    name = f"{pid}.sock"
    try:
        with RuntimeDir() as folder:
            try:
                return connect(folder.inside(name), read_only)
            except Refused as e:  # said with the path the user knows
                raise Refused(str(e).replace(folder.inside(name),
                                             os.path.join(folder.path, name))) from None
    except FolderRefused as e:
        raise UsageError(str(e)) from None


def watch(viewer: Viewer, started: subprocess.Popen | None = None) -> int:
    """The dashboard on a run's process until q ends the run (the run's exit code), d leaves
    it going (0) or the terminal closes (SIGHUP ends this process alone)."""
    from ddptui.dashboard.view.app import DashboardApp

    app = DashboardApp(viewer)

    def on_signal(signum, _frame) -> None:
        # Ctrl-C or SIGTERM to the dashboard ends the run, as they would end torchrun; the app's
        # refresh tick exits once the run has.
        app.quitting = True
        viewer.stop(code=128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    if is_tab():  # a browser tab's: it leaves with ddptui web, however that ends
        end_with_server(viewer.close)
    app.run()
    if app.detached or not viewer.done.is_set():
        viewer.close()
        if app.crashed:  # an exception ended the app (Textual printed it)
            print(f"ddptui: the dashboard failed (its traceback is above); the run goes on: "
                  f"{comeback(viewer)}", file=sys.stderr)
            return 1
        print(f"ddptui: {viewer.name} goes on (pid {viewer.pid}): {comeback(viewer)}", flush=True)
        return 0
    if started is not None:
        try:
            started.wait(REAP_S)
        except subprocess.TimeoutExpired:
            pass  # it closes by itself; its parent is init once this process ends
    return ended(viewer)


def follow(viewer: Viewer) -> int:
    """Without a screen: the run's lines until it ends (its exit code); Ctrl-C leaves it going."""
    console = HeadlessConsole(viewer.state)
    viewer.start()
    try:
        while not viewer.done.wait(0.25):
            console.poll()
    except KeyboardInterrupt:
        viewer.close()
        print(f"ddptui: {viewer.name} goes on: {comeback(viewer)}", flush=True)
        return 0
    console.finish()  # its last line says what the run came to
    return ended(viewer, said=True)


def ended(viewer: Viewer, said: bool = False) -> int:
    """What the run came to, said once the screen is gone (unless `said`); its exit code."""
    view = viewer.state.view()
    if viewer.lost:
        print(f"ddptui: lost {viewer.name}'s process (pid {viewer.pid}); its log: "
              f"{viewer.log_path}", file=sys.stderr)
        return 1
    if not said:
        print(f"ddptui: {summary(view)}", flush=True)
    print_verdict(viewer.state)
    code = viewer.exit_code
    if code not in (0, None) and view.reason:
        print(f"ddptui: {view.status}: {view.reason}", file=sys.stderr)
    return 1 if code is None else code


def comeback(viewer: Viewer) -> str:
    return f"ddptui attach {viewer.name} watches it again; log {viewer.log_path}"
