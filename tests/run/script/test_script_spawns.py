"""Scripts that start their own ranks (mp.spawn as the ImageNet example, start_processes(fork)
as Keras's guide, multiprocessing.Process, a torchrun of their own) and scripts of
torch.distributed.launch's age (--local_rank), run as a user runs them: each rank that joins a
process group is a rank of its own, with its own row, output, stacks, end and blame."""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest

from ddptui.contract.options.script import parse_script_args
from ddptui.dashboard.view.app import DashboardApp
from ddptui.run.script.run import ScriptRun
from tests.helpers.runs import (
    ROOT,
    assert_gone,
    ddptui,
    events,
    local_port,
    run_pids,
    start_ddptui,
    wait_for_event,
)
from tests.helpers.screens import rank_row
from tests.helpers.scriptruns import until_shown

SCRIPTS = os.path.join(ROOT, "tests", "helpers", "scripts")
SPAWNS = os.path.join(SCRIPTS, "spawns.py")
LAUNCH_ERA = os.path.join(SCRIPTS, "launch_era.py")
ENVDUMP = os.path.join(SCRIPTS, "envdump.py")
GROUP_ONCE = os.path.join(SCRIPTS, "group_once.py")


def _env(env: dict) -> dict:
    return dict(env, OMP_NUM_THREADS="1")


def _joined(log) -> dict[int, int]:
    """rank -> pid of the process that joined as it."""
    return {e["rank"]: e["pid"] for e in events(log, "rank")
            if e["rank"] >= 0 and e.get("state") == "running" and e.get("pid")}


def _ends(log) -> dict[int, tuple[str, str]]:
    return {e["rank"]: (e["state"], e.get("reason", "")) for e in events(log, "rank")
            if e["rank"] >= 0 and e.get("exit_code") is not None}


@pytest.mark.parametrize("shape, count", [("spawn", []), ("fork", ["--nproc-per-node", "1"]),
                                          ("process", [])])
def test_each_rank_a_script_starts_is_a_rank_of_its_own(env, tmp_path, shape, count):
    """Two rank rows with the process group's ranks and their own pids, not the launcher's;
    each rank's loss read from its own output, its lines in its own .out file, none fused or
    lost (mp.spawn's ranks share the launcher's stdout: 5-7% of lines fused before); the run
    done and nothing left. The no-count form and --nproc-per-node 1 both run it once."""
    log = tmp_path / f"{shape}.jsonl"
    lines = 3000 if shape == "spawn" else 0
    r = ddptui(["run", *count, "--log", str(log), SPAWNS, "--shape", shape, "--port",
                str(local_port()), "--lines", str(lines)], _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "spawns.py starts its own ranks" in r.stderr
    joined = _joined(log)
    launcher = next(e["pid"] for e in events(log, "run") if e.get("status") == "started")
    assert sorted(joined) == [0, 1] and len(set(joined.values())) == 2
    assert launcher not in joined.values()
    assert [e["size"] for e in events(log, "world")] == [2]
    for rank in (0, 1):
        losses = [e for e in events(log, "epoch") if e["rank"] == rank and e.get("train_loss")]
        assert len(losses) == 2, f"rank {rank}: {losses}"
        assert _ends(log)[rank][0] == "done"
    for rank in (0, 1) if lines else ():
        with open(f"{str(log)[:-6]}.rank{rank}.out") as f:
            printed = [line.rstrip("\n") for line in f if " line " in line]
        assert printed == [f"rank {rank} line {i} " + "x" * 40 for i in range(lines)]
    assert [e["status"] for e in events(log, "run")][-1] == "done"
    assert_gone(run_pids(log) | set(joined.values()))


def test_a_rank_that_raises_is_blamed_and_its_launcher_ends_the_other(env, tmp_path):
    """mp.spawn hands a worker's exception to the launcher, which raises its own: the run's
    failure names rank 1 and its exception, and rank 0 ended by the launcher, not by ddptui."""
    log = tmp_path / "fail.jsonl"
    r = ddptui(["run", "--log", str(log), SPAWNS, "--fail", "--port", str(local_port())],
               _env(env), tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    failed = events(log, "run")[-1]
    assert failed["status"] == "failed"
    assert failed["reason"].startswith("rank 1 exited with code 1")
    assert "ValueError: rank 1 broke on purpose" in failed["reason"]
    ends = _ends(log)
    assert ends[1][0] == "crashed"
    assert ends[0] == ("stopped", "ended by the script's launcher (killed by SIGTERM) after "
                                  "rank 1 failed")
    errors = events(log, "error")
    assert [e["rank"] for e in errors] == [1]
    assert_gone(run_pids(log) | set(_joined(log).values()))


def test_a_hung_rank_is_flagged_and_the_one_waiting_for_it_named(env, tmp_path):
    """Rank 1 stuck in its own code: flagged stalled with its own stacks (its function, not
    the launcher's join), rank 0 shown waiting for it in DDP's all-reduce; SIGTERM ends all."""
    log = tmp_path / "hang.jsonl"
    p = start_ddptui(["run", "--stall-after", "3", "--grace", "3", "--log", str(log), SPAWNS,
                      "--hang", "120", "--port", str(local_port())], _env(env), tmp_path)
    try:
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 1 and e.get("stacks"), 90)
        assert "busy_in_my_own_code" in stacks["stacks"] and "main_worker" in stacks["stacks"]
        waiting = wait_for_event(log, lambda e: e["kind"] == "rank" and e["rank"] == 0 and
                                 e.get("state") == "waiting", 30)
        assert waiting["waiting_for"] == [1]
        stalled = [e for e in events(log, "rank") if e["rank"] == 1 and e.get("state") == "stalled"]
        assert stalled, "rank 1 was never flagged"
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 143
    finally:
        p.kill()
        p.wait()
    assert_gone(run_pids(log) | set(_joined(log).values()))


def test_copies_of_a_launcher_that_collide_on_its_port_are_told_the_form_to_use(env, tmp_path):
    """--nproc-per-node 2 on an mp.spawn script with a fixed port: two copies, one fails with
    EADDRINUSE (only that, before); a line says why and how to run it once."""
    port = str(local_port())
    r = ddptui(["run", "--nproc-per-node", "2", "--grace", "3", SPAWNS, "--port", port],
               _env(env), tmp_path)
    assert r.returncode == 1
    assert f"2 copies of the script collided on port {port}: a script that starts its own " \
        f"ranks (mp.spawn) runs once: ddptui run --nproc-per-node 1 {SPAWNS} --port {port}" \
        in r.stderr


def test_ddptui_init_inside_spawned_ranks_reports_each_rank(env, tmp_path):
    """Three lines in mp.spawn's workers: each reports as the rank its process group gave it
    (they all had the launcher's environment: two rank 0s before), and the run ends once."""
    log = tmp_path / "init.jsonl"
    r = ddptui(["run", "--log", str(log), SPAWNS, "--init", "--port", str(local_port())],
               _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    api = {e["rank"]: e["pid"] for e in events(log, "rank") if e.get("api") == "ddptui.init"}
    assert sorted(api) == [0, 1] and api == _joined(log)
    assert {e["rank"] for e in events(log, "step")} == {0, 1}
    assert [e["status"] for e in events(log, "run")] == ["started", "done"]


def test_a_torchrun_of_the_scripts_own_is_one_world_of_its_ranks(env, tmp_path):
    """`ddptui run --nproc-per-node 1 -m torch.distributed.run --nproc-per-node 2 ...`: the
    options after the module are torchrun's (they made two silent world-size-1 jobs before),
    and its two ranks are one world of 2 on screen."""
    log = tmp_path / "torchrun.jsonl"
    r = ddptui(["run", "--nproc-per-node", "1", "--log", str(log), "-m", "torch.distributed.run",
                "--standalone", "--nproc-per-node", "2", GROUP_ONCE], _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    joined = _joined(log)
    assert sorted(joined) == [0, 1] and len(set(joined.values())) == 2
    assert [e["size"] for e in events(log, "world")] == [2]
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("rank")) == \
        ["rank 0 of 2 loss: 0.5", "rank 1 of 2 loss: 0.5"]


def test_a_script_of_launchs_age_gets_its_local_rank_and_one_without_still_runs(env, tmp_path):
    """--local_rank from argparse, as torch.distributed.launch passed it: 0 and 1 (each rank
    took its default, -1, and so the same GPU before); a script that takes no such argument
    gets none."""
    r = ddptui(["run", "--nproc-per-node", "2", LAUNCH_ERA, "--tag", "x"], _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("local_rank")) == \
        ["local_rank 0 env 0 tag x", "local_rank 1 env 1 tag x"]
    assert "takes --local_rank (torch.distributed.launch's form)" in r.stderr
    r = ddptui(["run", "--nproc-per-node", "2", ENVDUMP], _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--local" not in r.stdout


@pytest.fixture
def script_env(env, monkeypatch):
    for name, value in _env(env).items():
        monkeypatch.setenv(name, value)


@pytest.mark.timeout(180)
async def test_the_dashboard_shows_spawned_ranks_t_on_one_and_k_kills_one(script_env, tmp_path):
    """Each rank its row (its own pid); t on rank 1 takes that worker's stacks; k kills rank 1
    alone, then mp.spawn ends rank 0 and the dashboard says so; q leaves no process."""
    log = tmp_path / "dash.jsonl"
    config = parse_script_args(["--log", str(log), "--grace", "3", SPAWNS, "--epochs", "1000",
                                "--port", str(local_port())])
    run = ScriptRun(dataclasses.replace(config, headless=False))
    app = DashboardApp(run)
    async with app.run_test(size=(160, 45), notifications=True) as pilot:
        await until_shown(pilot, lambda: len(_joined(log)) == 2 and
                     "loss:" in rank_row(app, 1).get("output", ""), log=log)
        joined = _joined(log)
        assert rank_row(app, 1)["pid"] == str(joined[1])
        assert rank_row(app, 0)["pid"] == str(joined[0])
        await pilot.press("down", "t")
        await until_shown(pilot, lambda: any(e.get("stacks_of") == 1 and "main_worker" in
                                        (e.get("stacks") or "") for e in events(log, "message")),
                     log=log)
        await pilot.press("escape")
        await pilot.press("k")
        await until_shown(pilot, lambda: len(_ends(log)) == 2, log=log)
        ends = _ends(log)
        assert ends[1][0] == "crashed" and "SIGKILL" in ends[1][1]
        assert ends[0][1].startswith("ended by the script's launcher")
        pids = run.pids() | set(joined.values())  # the launcher, its ranks, their children
        assert len(pids) >= 3
        await pilot.press("q")  # a failed run stays on screen until q
        await until_shown(pilot, run.done.is_set, 60, log)
        await pilot.pause(0.3)
    assert run.exit_code == 137
    assert events(log, "run")[-1]["reason"].startswith("rank 1 killed by SIGKILL")
    assert_gone(pids)


def test_options_after_the_script_are_its_own_unless_a_double_dash_closes_ddptuis(tmp_path):
    """torchrun's rule: what follows the script is the script's; ddptui's own options may stand
    right after it only when a -- ends them, or nothing else follows."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    config = parse_script_args([str(script), "--cpus", "3"])
    assert config.args == () and config.cpus == 3
    config = parse_script_args([str(script), "--cpus", "2", "--lr", "0.1"])
    assert config.args == ("--cpus", "2", "--lr", "0.1")
    config = parse_script_args([str(script), "--cpus", "3", "--", "--lr", "0.1"])
    assert config.args == ("--lr", "0.1") and config.cpus == 3


@pytest.mark.parametrize("source, call", [
    ("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=2)\n", "torch.multiprocessing.spawn"),
    ("import torch\ntorch.multiprocessing.spawn(f)\n", "torch.multiprocessing.spawn"),
    ("from torch.multiprocessing import start_processes as sp\nsp(f, start_method='fork')\n",
     "torch.multiprocessing.start_processes"),
    ("import multiprocessing as m\nctx = m.get_context('spawn')\nctx.Process(target=f)\n",
     "multiprocessing.Process"),
    ("from torch.distributed.launcher.api import elastic_launch\nelastic_launch(c, f)()\n",
     "torch.distributed.launcher.api.elastic_launch"),
    ("import torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n", None),
    ("def spawn(): pass\nspawn()\n", None),
    ("import torch, psutil\nimport multiprocessing\npsutil.Process(1).children()\n", None),
    ("import multiprocessing as m\nm.get_context('fork').Process(target=f).start()\n",
     "multiprocessing.Process"),
])
def test_a_script_that_starts_its_own_ranks_is_known_by_its_call(tmp_path, source, call):
    from ddptui.contract.observe.launchers import parse, starts_ranks

    path = tmp_path / "train.py"
    path.write_text(source)
    found = starts_ranks(parse(str(path)))
    assert (found.call if found else None) == call


def test_a_hello_at_the_rank_door_from_outside_the_launcher_is_refused():
    """What comes in at the run's rank socket is checked: a pid not under the launcher, or a
    rank out of range, is refused."""
    from ddptui.run.script.spawned import RankDoor

    door = RankDoor(lambda h, fd: None, lambda p, c: None, lambda p, h: None, lambda t: None)
    try:
        door.launcher = os.getpid()
        with pytest.raises(ValueError, match="not a process of this run's launcher"):
            door.check({"pid": os.getppid(), "rank": 0, "world": 2, "stream": 1, "gpu": None})
        with pytest.raises(ValueError):
            door.check({"pid": os.getpid(), "rank": 2, "world": 2, "stream": 1, "gpu": None})
        with pytest.raises(ValueError):
            door.check({"pid": "1", "rank": 0, "world": 2, "stream": 1, "gpu": None})
        assert oct(os.stat(door.folder).st_mode & 0o777) == "0o700"
    finally:
        door.close()
    assert not os.path.exists(door.folder)
