"""Your own script under ddptui, run as a user runs it: `ddptui run SCRIPT -- args` starts real
processes with torchrun's contract, shows their output and figures, flags a hung rank with its
stacks, ends everything on Ctrl-C, q or SIGTERM, and restarts the group like torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.runs import (
    ROOT,
    assert_gone,
    ddptui,
    events,
    run_pids,
    start_ddptui,
    wait_for_event,
)

SCRIPTS = os.path.join(ROOT, "tests", "helpers", "scripts")
ENVDUMP = os.path.join(SCRIPTS, "envdump.py")
LOOPING = os.path.join(SCRIPTS, "looping.py")
PLAIN = os.path.join(ROOT, "examples", "plain_ddp.py")
SMALL = ["--epochs", "2", "--samples", "256", "--image-size", "16"]


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _json_objects(text: str) -> list[dict]:
    """Every JSON object in `text`: ranks sharing one stdout may write theirs on one line."""
    decoder, found, i = json.JSONDecoder(), [], text.find("{")
    while i >= 0:
        obj, end = decoder.raw_decode(text, i)
        found.append(obj)
        i = text.find("{", end)
    return found


def _script_env(env: dict) -> dict:
    return dict(env, OMP_NUM_THREADS="1")


def test_each_line_a_rank_prints_is_passed_on_whole(env, tmp_path):
    """Two ranks writing lines as fast as they can: each line reaches stdout whole (a rank's
    write can end mid-line, and the other's line was then written into its rest), and so does a
    last line with no newline, on the console and in the log."""
    log = tmp_path / "lines.jsonl"
    r = ddptui(["run", "--nproc-per-node", "2", "--log", str(log),
                os.path.join(SCRIPTS, "lines.py")], env, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    expected = {f"rank {rank} step {i} loss {1 / (i + 1):.6f}" for rank in (0, 1) for i in range(3000)}
    last = {f"rank {rank} ends without a newline" for rank in (0, 1)}
    lines = r.stdout.split("\n")
    assert lines[-1] == ""  # the last line ended too
    assert sorted(lines[:-1]) == sorted(expected | last)
    said = {e["text"] for e in events(log, "output") if e.get("final")}
    assert last <= said


@pytest.mark.timeout(120)
def test_a_plain_torchrun_script_runs_as_under_torchrun(env, tmp_path):
    """Same output on stdout and the same exit code as torchrun --standalone; its loss lines
    become per-rank loss points and epoch rows."""
    env = _script_env(env)
    for _ in range(3):  # the reference: torch's gloo may abort a rank at exit (see pyproject)
        torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   "--nproc-per-node", "2", PLAIN, *SMALL], env=env,
                                  cwd=tmp_path, capture_output=True, text=True, timeout=100)
        if "SIGABRT" not in torchrun.stderr:
            break
    assert torchrun.returncode == 0, torchrun.stderr[-2000:]
    log = tmp_path / "run.jsonl"
    ours = ddptui(["run", PLAIN, "--cpus", "2", "--log", str(log), "--tensorboard",
                   str(tmp_path / "tb"), "--", *SMALL], env, tmp_path)
    assert ours.returncode == 0, ours.stderr[-2000:]
    # Two ranks print at once: their lines may interleave (even within a line, as print()
    # writes the newline apart) differently from run to run; what they say may not differ.
    def said(text):
        return sorted(re.findall(r"(?:rank|epoch|step|loss:) [\d.]+|done in", text))

    assert said(ours.stdout) == said(torchrun.stdout) and len(said(ours.stdout)) >= 18
    steps = events(log, "step")
    assert {e["rank"] for e in steps} == {0, 1}
    assert all(e["source"] == "output" and e["loss"] > 0 for e in steps)
    assert {(e["rank"], e["epoch"]) for e in events(log, "epoch")} == \
        {(r, ep) for r in (0, 1) for ep in (0, 1)}
    assert (tmp_path / "run.rank1.out").read_text().count("loss:") == 2
    assert [e["status"] for e in events(log, "run")] == ["started", "done"]
    assert not any("no loss read" in e["text"] for e in events(log, "message"))
    assert_gone(run_pids(log))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(tmp_path / "tb"))  # every rank's loss, the epochs' figures
    tb.Reload()
    assert {"loss/rank0", "loss/rank1", "train_loss"} <= set(tb.Tags()["scalars"])
    assert [s.step for s in tb.Scalars("train_loss")] == [0, 1]


@pytest.mark.timeout(60)
def test_a_script_that_prints_no_loss_is_told_how_to_show_one(env, tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text("for i in range(60):\n    print(f'iteration {i} done')\n")
    log = tmp_path / "quiet.jsonl"
    r = ddptui(["run", "--cpus", "1", "--log", str(log), str(script)], env, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    hints = [e["text"] for e in events(log, "message") if "no loss read" in e["text"]]
    assert len(hints) == 1 and "run.step(loss)" in hints[0] and "--metric" in hints[0]
    assert not events(log, "step")


@pytest.mark.timeout(120)
def test_a_script_waiting_for_run_loaders_input_is_told_which_knob_may_help(env, tmp_path):
    """run.loader with no workers over samples that take 3 ms each: the same input warning as
    the built-in loop's, once, naming both ranks and W (its workers follow w/W)."""
    log = tmp_path / "slow.jsonl"
    r = ddptui(["run", "--cpus", "2", "--log", str(log), os.path.join(SCRIPTS, "slow_input.py")],
               env, ROOT, timeout=100)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [e for e in events(log, "message") if "input_wait" in e]
    assert len(said) == 1, said
    assert said[0]["input_wait"]["ranks"] == [0, 1] and said[0]["input_wait"]["knob"] == "W"
    assert said[0]["text"].startswith("input holds ranks 0, 1 back")


@pytest.mark.timeout(60)
def test_each_rank_gets_torchruns_environment_in_its_own_session(env, tmp_path):
    log = tmp_path / "env.jsonl"
    r = ddptui(["run", ENVDUMP, "--cpus", "3", "--log", str(log), "--", "a", "--b"], env,
               tmp_path)
    assert r.returncode == 0, r.stderr
    # Each rank's own file: on the shared stdout three ranks' lines may interleave.
    ranks = [_json_lines((tmp_path / f"env.rank{i}.out").read_text())[0] for i in range(3)]
    assert [d["env"]["RANK"] for d in ranks] == ["0", "1", "2"]
    assert [d["env"]["LOCAL_RANK"] for d in ranks] == ["0", "1", "2"]
    for d in ranks:
        e = d["env"]
        assert (e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) == ("3", "3", "0")
        assert e["ROLE_RANK"] == e["RANK"] and e["ROLE_WORLD_SIZE"] == "3"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"].isdigit()
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert e["OMP_NUM_THREADS"] == "1" and e["CUDA_VISIBLE_DEVICES"] == ""
        assert d["argv"] == ["a", "--b"] and d["leader"] and d["unbuffered"]
    assert len({d["env"]["TORCHELASTIC_RUN_ID"] for d in ranks}) == 1
    assert len({d["env"]["MASTER_PORT"] for d in ranks}) == 1


@pytest.mark.timeout(90)
def test_a_torchrun_command_line_works_with_ddptui_run_in_place_of_torchrun(env, tmp_path):
    """`s/torchrun/ddptui run/`: options first, no --, the script's arguments after it (its
    own --cpus among them), torchrun's --nproc_per_node and --standalone: each rank gets the
    arguments and the environment torchrun gives it with the same line."""
    line = ["--nproc_per_node", "2", "--standalone", ENVDUMP, "a", "--cpus", "9"]
    env = dict(env, CUDA_VISIBLE_DEVICES="")
    plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", *line], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=80)
    assert plain.returncode == 0, plain.stderr[-2000:]
    r = ddptui(["run", "--headless", "--log", str(tmp_path / "t.jsonl"), *line], env, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    theirs = sorted(_json_objects(plain.stdout), key=lambda d: d["env"]["RANK"])
    ours = [_json_lines((tmp_path / f"t.rank{i}.out").read_text())[0] for i in range(2)]
    same = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES"]
    assert [[d["env"][k] for k in same] for d in ours] == \
        [[d["env"][k] for k in same] for d in theirs]
    assert [d["argv"] for d in ours] == [d["argv"] for d in theirs] == [["a", "--cpus", "9"]] * 2


SHELL_RANK = """#!/bin/sh
echo "rank $RANK of $WORLD_SIZE local $LOCAL_RANK args $*"
echo "rank $RANK warns" >&2
"""


def _shell_rank(folder, body: str = SHELL_RANK) -> str:
    path = folder / "rank.sh"
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def _torchrun(line: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", *line], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=80)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def _rank_files(log_dir) -> dict[str, str]:
    """torchrun's --log-dir files by their path under the run's folder (attempt_0/1/stdout.log)."""
    (run,) = list(log_dir.iterdir())
    return {str(p.relative_to(run)): p.read_text() for p in sorted(run.rglob("*.log"))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("console", [
    ["--tee", "3", "--local-ranks-filter", "0"],
    ["--redirects", "1", "--tee", "2", "--log-line-prefix-template", "${rank}|"],
])
def test_torchruns_console_options_with_no_python_show_and_keep_what_torchrun_does(
        console, env, tmp_path):
    """--no-python runs a shell script as each rank; --tee, --redirects, --local-ranks-filter
    and the prefix template put on the console, and in --log-dir's files, what torchrun puts
    there with the same line; every rank's whole output is still in its .rankN.out."""
    script = _shell_rank(tmp_path)
    env = dict(env, CUDA_VISIBLE_DEVICES="")

    def line(log_dir):
        return ["--nproc-per-node", "2", "--no-python", *console, "--log-dir", str(log_dir),
                script, "a", "--b"]

    theirs = _torchrun(line(tmp_path / "theirs"), env, tmp_path)
    ours = ddptui(["run", "--headless", "--log", str(tmp_path / "t.jsonl"),
                   *line(tmp_path / "ours")], env, tmp_path)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert sorted(ours.stdout.splitlines()) == sorted(theirs.stdout.splitlines())
    shown = re.compile(r"^(\[default\d\]:|\d\|)")  # torchrun's own log lines are not the ranks'
    assert sorted(x for x in ours.stderr.splitlines() if shown.match(x)) == \
        sorted(x for x in theirs.stderr.splitlines() if shown.match(x))
    assert _rank_files(tmp_path / "ours") == _rank_files(tmp_path / "theirs")
    assert len(_rank_files(tmp_path / "ours")) == 4
    for rank in (0, 1):  # two streams, two readers: either line may come first
        assert sorted((tmp_path / f"t.rank{rank}.out").read_text().splitlines()) == \
            [f"rank {rank} of 2 local {rank} args a --b", f"rank {rank} warns"]


@pytest.mark.timeout(60)
def test_a_no_python_rank_and_the_python_it_starts_die_with_ddptui(env, tmp_path):
    """A shell script's python is armed as the rank: it reports, and ddptui killed takes the
    script and its python with it."""
    script = _shell_rank(tmp_path, f'#!/bin/sh\n"{sys.executable}" "{LOOPING}" "$@"\n')
    log = tmp_path / "sh.jsonl"
    # Rank 0's python then sleeps, writing nothing: no broken pipe would end it.
    p = start_ddptui(["run", "--cpus", "2", "--no-python", "--log", str(log), script,
                      "--stuck-rank", "0"], env, tmp_path)
    try:
        wait_for_event(log, lambda e: e["kind"] == "step" and e["rank"] == 1, 30)
        deadline = time.monotonic() + 30
        while "step 4 loss" not in (tmp_path / "sh.rank0.out").read_text():  # then it sleeps
            assert time.monotonic() < deadline, "rank 0 did not reach its sleep"
            time.sleep(0.1)
        pids = run_pids(log)
        assert len(pids) >= 4  # two shells, two pythons
        p.kill()
        p.wait(10)
    finally:
        p.kill()
    assert_gone(pids)


@pytest.mark.timeout(90)
def test_a_script_with_record_fails_with_its_exception_and_where_it_was_raised(env, tmp_path):
    """torchrun's error-file contract: each rank gets TORCHELASTIC_ERROR_FILE, torch's @record
    writes the exception there, and it is the failure's reason with the line that raised."""
    log = tmp_path / "rec.jsonl"
    r = ddptui(["run", "--cpus", "2", "--headless", "--log", str(log),
                os.path.join(SCRIPTS, "recorded.py")], env, tmp_path, timeout=80)
    assert r.returncode == 1, r.stderr[-2000:]
    failed = [line for line in r.stderr.splitlines() if line.startswith("ddptui: failed:")]
    assert failed and failed[0].endswith(": ValueError: bad shard 7 (recorded.py:8)"), failed
    error = events(log, "error")[0]
    assert error["traceback"][-1] == "ValueError: bad shard 7 (recorded.py:8)"
    assert any("in load_shard" in line for line in error["traceback"])


@pytest.mark.timeout(60)
def test_a_module_runs_with_dash_m_and_a_sitecustomize_of_the_users_still_runs(env, tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text(open(ENVDUMP).read())
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    env = dict(env, PYTHONPATH=os.pathsep.join([str(site), str(tmp_path), env["PYTHONPATH"]]))
    r = ddptui(["run", "-m", "mypkg.train", "--cpus", "2", "--log", str(tmp_path / "m.jsonl")],
               env, tmp_path)
    assert r.returncode == 0, r.stderr
    ranks = [_json_lines((tmp_path / f"m.rank{i}.out").read_text())[0] for i in range(2)]
    assert all(d["env"]["CHAINED"] == "yes" for d in ranks)


@pytest.mark.timeout(120)
def test_a_failing_rank_gives_its_exit_code_traceback_and_ends_the_others(env, tmp_path):
    log = tmp_path / "fail.jsonl"
    r = ddptui(["run", PLAIN, "--cpus", "2", "--grace", "5", "--log", str(log), "--", *SMALL,
                "--fail-at-epoch", "1"], _script_env(env), tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    ours = [line for line in r.stderr.splitlines() if line.startswith("ddptui:")]
    assert ours[-1].startswith("ddptui: failed: rank 1 exited with code 1 (the script's own, "
                               "passed on): RuntimeError: rank 1 gave up at epoch 1"), \
        r.stderr[-2000:]
    assert "Traceback" in r.stderr  # the script's own, passed through as torchrun shows it
    error = events(log, "error")[0]
    assert error["rank"] == 1 and error["exit_code"] == 1
    assert error["traceback"][-1] == "RuntimeError: rank 1 gave up at epoch 1"
    assert any("misbehave" in line for line in error["traceback"])
    assert [e["status"] for e in events(log, "run")] == ["started", "failed"]
    assert_gone(run_pids(log))


@pytest.mark.timeout(60)
def test_max_restarts_starts_every_rank_again_with_the_count(env, tmp_path):
    log = tmp_path / "flaky.jsonl"
    r = ddptui(["run", LOOPING, "--cpus", "2", "--max-restarts", "1", "--grace", "5", "--log",
                str(log), "--", "--fail-first", "--steps", "3"], env, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    runs = events(log, "run")
    assert [(e["status"], e.get("restart")) for e in runs if e["status"] == "started"] == \
        [("started", 0), ("started", 1)]
    assert [e["status"] for e in runs if e["status"] != "started"] == ["failed", "done"]
    assert events(log, "error")[0]["text"] == "ValueError: the first attempt of rank 1 fails"
    assert r.stdout.count("finished") == 2  # the second attempt's two ranks
    assert_gone(run_pids(log))


@pytest.mark.timeout(90)
def test_a_hung_rank_is_flagged_with_its_stacks_and_ctrl_c_ends_everything(env, tmp_path):
    """Rank 1 sleeps for ever in stuck_here(): it is the stalled one and `t`'s stacks name the
    function; rank 0, blocked in DDP's all-reduce, waits for it. Ctrl-C: nothing is left."""
    log = tmp_path / "hang.jsonl"
    p = start_ddptui(["run", PLAIN, "--cpus", "2", "--stall-after", "3", "--grace", "3",
                      "--log", str(log), "--", *SMALL, "--epochs", "50", "--hang-at-epoch",
                      "1"], _script_env(env), tmp_path)
    try:
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 1 and e.get("stacks"), 60)
        assert "misbehave" in stacks["text"] and "plain_ddp.py" in stacks["text"]
        # Both go silent: rank 0 may be flagged stalled too, until its stacks show it waits.
        assert 1 in {e["rank"] for e in events(log, "rank") if e.get("state") == "stalled"}
        waiting = wait_for_event(log, lambda e: e.get("state") == "waiting", 15)
        assert waiting["rank"] == 0 and waiting["waiting_for"] == [1]
        shown = {e["rank"]: e["state"] for e in events(log, "rank") if e.get("state")}
        assert shown == {0: "waiting", 1: "stalled"}
        pids = run_pids(log)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130, err[-2000:]
    assert [e["status"] for e in events(log, "run")] == ["started", "interrupted"]
    assert_gone(pids)


@pytest.mark.timeout(60)
def test_a_sigstopped_rank_is_flagged_stopped_and_sigterm_kills_it_after_the_grace(env,
                                                                                   tmp_path):
    log = tmp_path / "stop.jsonl"
    p = start_ddptui(["run", LOOPING, "--cpus", "2", "--stall-after", "2", "--grace", "2",
                      "--log", str(log)], env, tmp_path)
    try:
        wait_for_event(log, lambda e: e["kind"] == "step" and e["rank"] == 1, 30)
        victim = next(e["pid"] for e in events(log, "rank") if e["rank"] == 1 and e.get("pid"))
        pids = run_pids(log)
        os.kill(victim, signal.SIGSTOP)
        flagged = wait_for_event(log, lambda e: e.get("state") == "stalled" and e["rank"] == 1,
                                 30)
        assert flagged["cause"] == "stopped"
        assert flagged["reason"].startswith("process stopped")
        no_stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 1, 15)
        assert "stopped" in no_stacks["text"]
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 143, err
    assert_gone(pids)


def _two_looping_ranks(env, log) -> tuple[subprocess.Popen, set[int]]:
    """ddptui running LOOPING on 2 CPU ranks, once rank 1 has stepped: (ddptui, every pid)."""
    p = start_ddptui(["run", LOOPING, "--cpus", "2", "--log", str(log)], env, log.parent)
    try:
        wait_for_event(log, lambda e: e["kind"] == "step" and e["rank"] == 1, 30)
    except BaseException:
        p.kill()
        raise
    return p, run_pids(log)


@pytest.mark.timeout(60)
def test_sighup_as_a_closed_terminal_sends_it_stops_every_rank_with_129(env, tmp_path):
    log = tmp_path / "hup.jsonl"
    p, pids = _two_looping_ranks(env, log)
    try:
        p.send_signal(signal.SIGHUP)
        out, err = p.communicate(timeout=40)
    finally:
        p.kill()
    assert p.returncode == 129, err
    assert events(log, "run")[-1]["status"] == "interrupted"
    assert_gone(pids)


@pytest.mark.timeout(90)
def test_a_hung_rank_stays_flagged_through_torchs_own_log_and_q_kills_it_in_3_s(env, tmp_path):
    """Rank 1 hangs deaf to SIGINT and SIGTERM, as one blocked in NCCL is, while torch's C++
    log goes on (the NCCL watchdog's lines when asked for a dump): it is never shown running
    again, and a stop with --grace 600 does not wait for it (SIGKILL after 3 s)."""
    log = tmp_path / "deaf.jsonl"
    p = start_ddptui(["run", LOOPING, "--cpus", "2", "--stall-after", "2", "--grace", "600",
                      "--log", str(log), "--", "--stuck-rank", "1", "--deaf", "--noise"],
                     env, tmp_path)
    try:
        wait_for_event(log, lambda e: e.get("state") == "stalled" and e["rank"] == 1, 40)
        wait_for_event(log, lambda e: e.get("stacks_of") == 1 and e.get("stacks"), 15)
        out = tmp_path / "deaf.rank1.out"
        noise = open(out).read().count("ProcessGroupNCCL")
        # Four more of the watchdog's lines after the stacks came (each would have been taken
        # for progress): sampled eight times meanwhile, rank 1 is still flagged.
        while open(out).read().count("ProcessGroupNCCL") < noise + 4:
            time.sleep(0.2)
        pids = run_pids(log)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130, err[-2000:]
    states = [e["state"] for e in events(log, "rank") if e["rank"] == 1]
    assert "running" not in states[states.index("stalled"):]
    (last,) = [e for e in events(log, "rank") if e["rank"] == 1][-1:]
    assert last["exit_code"] == 128 + signal.SIGKILL and "killed by SIGKILL" in last["reason"]
    assert any("1 hung rank (1) killed after 3 s" in e["text"] for e in events(log, "message"))
    assert_gone(pids)


@pytest.mark.timeout(60)
def test_the_parent_killed_takes_every_rank_with_it(env, tmp_path):
    p, pids = _two_looping_ranks(env, tmp_path / "orphan.jsonl")
    p.kill()
    p.wait(10)
    assert_gone(pids)


@pytest.mark.parametrize("args, says", [
    (["run", "nosuch.py"], "no such script: nosuch.py"),
    (["run", "-m", "nosuchpkg.train"], "module not found: nosuchpkg.train"),
    (["run", "--steps", "3", LOOPING], "--steps is not a ddptui run option (ddptui run --help); "
                                        "the script's own arguments go after the script"),
    (["run", "--nnodes", "2", LOOPING], "--nnodes 2: ddptui run is one machine"),
    (["run", LOOPING, "--log", "/proc/x.jsonl"],
     "--log /proc/x.jsonl: cannot write this file (/proc takes no new files)"),
    (["run", SCRIPTS], "is a folder: name the script in it"),
    (["run", "--start-method", "fork", LOOPING],
     "torchrun's --start-method is not supported by ddptui run yet"),
    (["run", "--tee", "5", LOOPING], "argument --tee: '5': 0, 1 (stdout)"),
    (["run", "--local-ranks-filter", "a", LOOPING], "argument --local-ranks-filter: 'a'"),
    (["run", "--no-python", "-m", "pkg.train"], "--no-python and -m cannot go together"),
    (["run", "--no-python", "nosuchprogram"], "nosuchprogram is not a program this machine"),
    (["run", "--no-python", LOOPING], "is not a program this machine can run"),
    (["run", "--log-dir", "/proc/x", LOOPING], "--log-dir is not writable: /proc/x"),
    (["run", "--nproc-per-node", "2", "--cpus", "2", LOOPING], "use one of --nproc-per-node"),
    (["run", "--nproc_per_node", "two", LOOPING], "bad --nproc-per-node 'two'"),
    (["run", LOOPING, "--metric", "acc=([0-9]"], "bad --metric 'acc=([0-9]'"),
    (["run", LOOPING, "--metric", "acc=[0-9]+"], "needs exactly one (group)"),
    (["run", LOOPING, "--stacks-signal", "SIGKILL"], "cannot carry stacks"),
    (["run", LOOPING, "--cpus", "0"], "--cpus: must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_rank_starts(args, says, tmp_path, cli_main):
    code, err = cli_main(args)
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert not (tmp_path / "runs").exists()


@pytest.mark.timeout(60)
def test_a_script_that_rejects_its_arguments_is_one_line_with_its_exit_code(env, tmp_path):
    r = ddptui(["run", LOOPING, "--", "--bogus"], env, tmp_path, timeout=50)
    assert r.returncode == 2, r.stderr
    ours = [line for line in r.stderr.splitlines()  # ddptui's, or its parser's (ddptui run ...)
            if line.startswith("ddptui") and "logging to" not in line]
    assert len(ours) == 1, r.stderr
    # either rank first
    assert "exited with code 2 (the script's own, passed on): looping.py: error: unrecognized " \
        "arguments: --bogus" in ours[0]
    assert "Traceback" not in r.stderr

