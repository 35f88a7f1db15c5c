"""`ddptui ls`: this user's runs on this machine, from the records runs leave in the user's
runtime folder: none, one running, and how it ended once it has."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from ddptui.contract.runs.registry import runs
from ddptui.contract.runs.runtime_dir import FolderRefused as RuntimeDirRefused
from tests.helpers.runs import (
    ROOT,
    TINY,
    assert_gone,
    ddptui,
    detached,
    events,
    imported,
    run_pids,
    start_ddptui,
    wait_for_event,
)


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


def _ls(env, cwd) -> tuple[int, list[str], list[str]]:
    r = ddptui(["ls"], env, cwd)
    return r.returncode, r.stdout.splitlines(), r.stderr.splitlines()


def test_a_runtime_folder_swapped_by_a_link_is_never_followed(env, tmp_path, monkeypatch):
    """Another user's link at the folder's path, swapped between their folder and this user's
    own as fast as it can: ls never lists their record, never removes a file outside the folder
    (their record, named "/victim/precious" and a week old, asked for precious.out), and says
    in one line what is wrong; a dangling link there is refused alike, by ls, attach and run."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    env = dict(env, XDG_RUNTIME_DIR=str(runtime))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))  # runs() in this process too
    victim, theirs = tmp_path / "victim", tmp_path / "theirs"
    for d in (victim, theirs):
        d.mkdir(mode=0o700)
    (victim / "precious.out").write_text("kept")
    record = {"name": str(victim / "precious"), "pid": 1, "what": "x", "ranks": 1,
              "log": str(victim / "x.jsonl"), "started": 0}
    (theirs / "precious.1.json").write_text(json.dumps(record))
    (theirs / "ok.1.json").write_text(json.dumps({**record, "name": "planted"}))
    link = runtime / "ddptui"
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            for target in (victim, theirs):
                tmp = runtime / f".swap-{target.name}"
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                os.symlink(target, tmp)
                os.replace(tmp, link)

    os.symlink(victim, link)  # there before the first look (a missing folder is made)
    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        for _ in range(40):
            with contextlib.suppress(RuntimeDirRefused):
                assert [r.name for r in runs()] == []
            assert (victim / "precious.out").read_text() == "kept"
        code, out, err = _ls(env, tmp_path)
        assert code == 2 and out == [] and len(err) == 1 and "symbolic link" in err[0], err
    finally:
        stop.set()
        swapper.join()
    os.unlink(link)
    os.symlink(tmp_path / "nowhere", link)  # dangling
    for args in (["ls"], ["attach"], ["run", *TINY, "--detach"]):
        r = ddptui(args, env, tmp_path)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, (args, r.stderr)
        assert "is a symbolic link, not this user's own folder: remove it" in r.stderr
    assert not os.path.exists(tmp_path / "nowhere")


def test_records_that_are_not_a_runs_are_skipped_with_a_line_each(env, tmp_path):
    """Fields of the wrong type, a name with escape codes, a file that is no record: ls lists
    the good record and says, one line each on stderr, which it skipped; attach "" is no name."""
    env = dict(env, XDG_RUNTIME_DIR=str(tmp_path / "runtime"))
    folder = tmp_path / "runtime" / "ddptui"
    folder.mkdir(parents=True, mode=0o700)
    ended = subprocess.Popen(["true"])
    ended.wait()
    good = {"name": "good", "pid": ended.pid, "what": "resnet18\x1b[2J", "ranks": 2,
            "log": str(tmp_path / "good.jsonl"), "started": time.time()}
    bad = {"pid": "abc", "started": "yesterday", "log": None, "what": 5, "name": 3}
    for field, value in bad.items():
        (folder / f"bad-{field}.1.json").write_text(json.dumps({**good, field: value}))
    (folder / "escape.1.json").write_text(json.dumps({**good, "name": "r3\x1b[2J"}))
    (folder / "garbage.1.json").write_text("{not json")
    (folder / "good.1.json").write_text(json.dumps(good))
    code, out, err = _ls(env, tmp_path)
    assert code == 0 and len(out) == 2 and out[1].split()[:2] == ["good", "ended"], out
    assert "resnet18\\x1b[2J" in out[1] and "\x1b" not in "".join(out)
    assert len(err) == 7 and all(line.startswith("ddptui: warning: skipped the run record ")
                                 for line in err), err
    r = ddptui(["attach", ""], env, tmp_path)
    assert r.returncode == 2 and r.stderr == ("ddptui: error: an empty run name names no run "
                                              "(ddptui ls lists them)\n")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_ends_the_run_in_order_and_ls_says_why(env, tmp_path):
    """The log on a tmpfs with 32 KiB left fills as the run goes: the run ends failed, with one
    line saying why, every line in the log whole, and ls says failed; no traceback anywhere."""
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], check=True)
    try:
        (small / "filler").write_bytes(b"x" * (224 * 1024))  # a few seconds of steps fill the rest
        env = dict(env, XDG_RUNTIME_DIR=str(tmp_path / "runtime"))
        log = small / "full.jsonl"
        r = ddptui(["run", *TINY, "--cpus", "2", "--epochs", "100000", "--headless", "--log",
                    str(log)], env, tmp_path, timeout=300)
        assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
        assert "Traceback" not in r.stdout + r.stderr
        why = f"its log {log} cannot be written: No space left on device"
        assert f"the run ends: {why}" in r.stdout + r.stderr
        with open(log, "rb") as f:
            lines = f.read().split(b"\n")
        assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])
        code, out, _err = _ls(env, tmp_path)
        assert code == 0 and out[1].split()[:2] == ["full", "failed"], out
        for out_file in (tmp_path / "runtime" / "ddptui").glob("*.out"):
            assert "Traceback" not in out_file.read_text()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_each_process_loads_its_own_side_and_attach_into_head_ends_quietly(env, tmp_path):
    """A dashboard's process (`ddptui run --detach` until it leaves, `ddptui attach --headless`)
    imports no module of the run's side, the run's own process none of a dashboard's (what
    PYTHONPROFILEIMPORTTIME lists). The attach piped into head ends as a command SIGPIPE ended,
    and the run goes on."""
    log, said = tmp_path / "piped.jsonl", []
    timed = dict(env, PYTHONPROFILEIMPORTTIME="1")
    pid, _path = detached(timed, log, stderr=said)
    pids = run_pids(log) | {pid}
    try:
        r = subprocess.run(["bash", "-c", f"{sys.executable} -m ddptui attach {log.stem} "
                            "--headless | head -1; echo ${PIPESTATUS[0]} >&2"],
                           env=timed, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert len(r.stdout.splitlines()) == 1
        assert r.stderr.splitlines()[-1] == "141", r.stderr  # as a command SIGPIPE ended
        assert [line for line in r.stderr.splitlines()[:-1]
                if not line.startswith("import time:")] == []
        with open(os.path.join(env["XDG_RUNTIME_DIR"], "ddptui", f"{log.stem}.out")) as f:
            run_out = f.read()
        for dashboard in (said[0], r.stderr):
            assert {"ddptui.contract.socket.viewer", "ddptui.dashboard.main"} <= \
                imported(dashboard)
            assert not {m for m in imported(dashboard) if m.startswith("ddptui.run")}
        assert "ddptui.run.main" in imported(run_out)
        assert not {m for m in imported(run_out) if m.startswith("ddptui.dashboard")}
        step = events(log, "step")[-1]["global_step"]
        wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step, 60)
    finally:
        os.kill(pid, signal.SIGTERM)
        assert_gone(pids, timeout=60)


def test_another_user_can_neither_list_nor_attach(env, tmp_path):
    """A second user given this user's runtime folder (made reachable): ls and attach refuse it
    in one line each, as `nobody`."""
    runtime = tempfile.mkdtemp(prefix="ddptui-rt-", dir="/tmp")
    os.chmod(runtime, 0o755)
    env = dict(env, XDG_RUNTIME_DIR=runtime, HOME="/tmp")
    log = tmp_path / "mine.jsonl"
    pid, _path = detached(env, log)
    pids = run_pids(log) | {pid}
    try:
        os.chmod(os.path.join(runtime, "ddptui"), 0o755)  # its mode alone no longer keeps them out
        for args in (["ls"], ["attach"], ["attach", log.stem]):
            code, err = _main_as_nobody(args, runtime)
            assert code == 2 and len(err.splitlines()) == 1, (args, err)
            assert "is not this user's own folder (owner 0, mode 0o755)" in err
    finally:
        os.chmod(os.path.join(runtime, "ddptui"), 0o700)
        os.kill(pid, signal.SIGTERM)
        assert_gone(pids, timeout=60)
        shutil.rmtree(runtime, ignore_errors=True)


def _main_as_nobody(args: list[str], runtime: str) -> tuple[int, str]:
    """ddptui's main(ARGS) in a child process that became user 65534: its exit code and
    stderr (the interpreter here is not one that user may start)."""
    # Nor may it read the interpreter's library: every module these commands use is imported
    # here first, whatever the tests before this one in its worker happened to import.
    import ddptui.browse  # noqa: F401
    import ddptui.cli  # noqa: F401
    import ddptui.dashboard.main  # noqa: F401

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.close(read)
        code = 1
        try:
            os.setgid(65534)
            os.setuid(65534)
            sys.stderr = open(write, "w")  # noqa: SIM115 (pytest holds the real one)
            os.environ["XDG_RUNTIME_DIR"] = runtime
            from ddptui.cli import main

            code = main(args)
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        err = f.read()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status), err
