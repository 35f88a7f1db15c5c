"""`ddptui ls`: this user's runs on this machine, from the records runs leave in the user's
runtime folder: none, one running, and how it ended once it has."""

from __future__ import annotations

import os
import signal

from tests.helpers.runs import ROOT, TINY, ddptui, events, start_ddptui, wait_for_event


def test_ls_lists_none_then_a_running_run_then_how_it_ended(env, tmp_path):
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path / "runtime"))
    os.makedirs(env["XDG_RUNTIME_DIR"])
    r = ddptui(["ls"], env, tmp_path)
    assert r.returncode == 0 and r.stdout == "no runs of this user on this machine\n"

    log = tmp_path / "mine.jsonl"
    run = start_ddptui(["run", *TINY, "--cpus", "2", "--epochs", "500", "--log", str(log)], env,
                       ROOT)
    try:
        wait_for_event(log, lambda e: e["kind"] == "step", 90)
        header, row = ddptui(["ls"], env, tmp_path).stdout.splitlines()
        assert header.split() == ["NAME", "STATE", "PID", "RANKS", "AGE", "WHAT", "LOG"]
        assert row.split()[:4] == ["mine", "running", str(run.pid), "2"]
        assert row.endswith(str(log))
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=60)
    assert events(log, "run")[-1]["status"] == "interrupted"
    _, row = ddptui(["ls"], env, tmp_path).stdout.splitlines()
    assert row.split()[:2] == ["mine", "interrupted"]

    # A folder others may write to could hold records naming any file: refused.
    os.chmod(os.path.join(env["XDG_RUNTIME_DIR"], "ddptui"), 0o777)
    r = ddptui(["ls"], env, tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("ddptui: error: ") and \
        "is not this user's own folder" in r.stderr and len(r.stderr.splitlines()) == 1
