"""The dashboard in a real terminal: tmux at 120x40 shows both ranks with live numbers, and `q`
ends the run and every process of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.helpers.runs import ROOT, TINY, assert_gone, events, run_pids
from tests.helpers.screens import end_tmux, tmux

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def _dashboard_in_tmux(env: dict, log, then: str = "", epochs: int = 500) -> str:
    """A 2-rank run's dashboard in a new 120x40 tmux session; its name."""
    session = f"ddptui-test-{time.monotonic_ns()}"
    cmd = " ".join([sys.executable, "-m", "ddptui", "run", *TINY, "--cpus", "2",
                    "--epochs", str(epochs), "--log", str(log)])
    environ = " ".join(f"{k}={env[k]}" for k in ("PYTHONPATH", "DDPTUI_CACHE", "XDG_RUNTIME_DIR"))
    tmux("new-session", "-d", "-s", session, "-x", "120", "-y", "40",
          f"cd {ROOT} && env -u COLUMNS -u LINES {environ} {cmd}{then}")
    return session


def test_dashboard_in_tmux_shows_both_ranks_and_q_ends_everything(env, tmp_path):
    log = tmp_path / "tui.jsonl"
    session = _dashboard_in_tmux(env, log, then="; sleep 30")
    try:
        deadline, screen = time.monotonic() + 60, ""
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-p", "-t", session)
            rows = re.findall(r"\b([01])\s+running\s+\d+/\d+\s+[\d.]+\s+[\d,]+", screen)
            if sorted(rows) == ["0", "1"] and "RUNNING" in screen:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"both ranks never showed live on screen:\n{screen}")
        pids = run_pids(log)
        tmux("send-keys", "-t", session, "q")  # asked first: the run has a process of its own
        deadline = time.monotonic() + 30
        while "End the run?" not in tmux("capture-pane", "-p", "-t", session):
            assert time.monotonic() < deadline, "q did not ask"
            time.sleep(0.3)
        tmux("send-keys", "-t", session, "y")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                e["status"] == "interrupted" for e in events(log, "run")):
            time.sleep(0.3)
        assert events(log, "run")[-1]["status"] == "interrupted"
        assert_gone(pids)
        # The screen closed: one line says what the run came to and where its log is (nothing
        # was printed).
        deadline, said = time.monotonic() + 30, []
        while time.monotonic() < deadline and not said:
            said = [line for line in tmux("capture-pane", "-p", "-t", session).splitlines()
                    if line.startswith("ddptui: interrupted in ")]
            time.sleep(0.3)
        assert len(said) == 1 and re.match(r"ddptui: interrupted in [\d.]+ s: \d+ epochs?"
                                           r"(, [\d,]+ img/s mean)?, best (val_acc|loss) \S+; "
                                           r"log ", said[0]), said
        assert said[0].endswith(f"log {log}") or str(log).startswith(said[0].split("log ")[-1])
        # The dashboard saw the run from its start (it connects as the run begins).
        assert float(said[0].split(" in ")[1].split(" s")[0]) > 0
    finally:
        end_tmux(session)


def test_a_closed_terminal_leaves_the_run_going_to_its_end_and_then_nothing(env, tmp_path):
    """The terminal closes mid-run (tmux kill-session: SIGHUP to its foreground process group,
    ranks and fork server included): the run trains to its last epoch without a screen, ends
    as it would have ('done', every epoch in its log), and no process of it is left."""
    log = tmp_path / "tui.jsonl"
    session = _dashboard_in_tmux(env, log, epochs=6)
    deadline = time.monotonic() + 60
    while not (log.exists() and events(log, "step")):
        assert time.monotonic() < deadline, "no step within 60 s"
        time.sleep(0.3)
    pids = run_pids(log)
    tmux("kill-session", "-t", session, check=False)
    try:
        deadline = time.monotonic() + 120
        while not [e for e in events(log, "run") if e["status"] != "started"]:
            assert time.monotonic() < deadline, "the run did not end within 120 s"
            time.sleep(0.5)
        assert events(log, "run")[-1]["status"] == "done"
        assert sorted({e["epoch"] for e in events(log, "epoch") if e["rank"] == 0}) == \
            list(range(6))
        assert_gone(pids, timeout=30)
    finally:
        for pid in pids:  # leave nothing behind, even when an assertion fails
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
        end_tmux(session)
