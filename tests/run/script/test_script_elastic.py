"""run.elastic() in your own script: a crashing rank is survived in place, s, k and r act on one
rank from the dashboard, and run.loader()'s epoch is shared out so that no sample is lost or
repeated when the world shrinks or goes back to a rollback point."""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import psutil
import pytest
import torch
from torch.utils.data import TensorDataset

from ddptui.contract.options.script import parse_script_args
from ddptui.dashboard.view.app import DashboardApp
from ddptui.dashboard.view.screens.confirm import ConfirmRestart
from ddptui.rank.api.loader import LiveLoader
from ddptui.run.script.run import ScriptRun
from tests.helpers.runs import (
    ROOT,
    assert_gone,
    ddptui,
    events,
    rank_pids,
    run_pids,
    start_ddptui,
    wait_for_event,
)
from tests.helpers.screens import rank_row
from tests.helpers.scriptruns import script_run, until_shown

ELASTIC = os.path.join(ROOT, "examples", "elastic_ddp.py")
CHILD = os.path.join(ROOT, "tests", "helpers", "scripts", "elastic_child.py")
FAILS = os.path.join(ROOT, "tests", "helpers", "scripts", "joiner_fails.py")
DIES = os.path.join(ROOT, "tests", "helpers", "scripts", "joiner_dies.py")
SLOW = os.path.join(ROOT, "tests", "helpers", "scripts", "slow_standby.py")
HEAVY = os.path.join(ROOT, "tests", "helpers", "scripts", "elastic_heavy.py")


@pytest.mark.timeout(120)
def test_a_crashing_rank_is_survived_and_the_others_finish_every_epoch(env, tmp_path):
    log = tmp_path / "crash.jsonl"
    r = ddptui(["run", ELASTIC, "--cpus", "2", "--log", str(log), "--", "--epochs", "3",
                "--samples", "256", "--image-size", "16", "--fail-at-epoch", "1"],
               dict(env, OMP_NUM_THREADS="1"), tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (error,) = events(log, "error")
    assert error["rank"] == 1 and error["text"] == "RuntimeError: rank 1 gave up at epoch 1"
    (world,) = [e for e in events(log, "world") if e["rank"] != -1]
    assert (world["rank"], world["size"], world["ranks"], world["generation"]) == (0, 1, [0], 1)
    assert any(e["text"].startswith("recovered on 1 rank: back to global step")
               for e in events(log, "message") if e["rank"] == 0)
    states = [(e["rank"], e["state"]) for e in events(log, "rank") if e.get("exit_code")
              is not None]
    assert sorted(states) == [(0, "done"), (1, "crashed")]
    # Epochs 1 and 2 on the one rank left: the whole epoch, every sample once.
    rows = {e["epoch"]: e["samples"] for e in events(log, "epoch") if e["rank"] == 0}
    assert rows == {0: 128, 1: 256, 2: 256}
    assert r.stdout.splitlines()[-1] == "epoch 2 done on 1 ranks"
    assert_gone(run_pids(log))


@pytest.mark.timeout(150)
async def test_s_r_and_k_act_on_one_rank_and_the_others_go_on(script_env,  # noqa: F811
                                                              monkeypatch, tmp_path):
    """...and a joiner prepares while the others train: its set-up (1 s here, before its
    process group) costs them nothing, nor does its script failing there."""
    log, missing = tmp_path / "dash.jsonl", tmp_path / "missing"
    monkeypatch.setenv("JOINER_FAILS", str(missing))
    # q sends SIGINT at half the grace to a rank not ended by then, and it is then "stopped", as
    # it should say: a machine under load took over 5 s to end a healthy rank after its last step.
    run = script_run([FAILS, "--cpus", "2", "--grace", "60", "--", "--epochs", "1000", "--samples",
                "2048", "--image-size", "16", "--step-seconds", "0.02", "--setup-seconds", "1"], log)
    app = DashboardApp(run)
    worlds = lambda: [e for e in events(log, "world") if e["rank"] != -1]  # noqa: E731
    async with app.run_test(size=(160, 45)) as pilot:
        await until_shown(pilot, lambda: run.world.elastic and all(
            any(e["rank"] == r for e in events(log, "step")) for r in range(2)))
        pids = rank_pids(log)
        await pilot.press("down", "s")  # rank 1 leaves; no whole-group restart asked
        assert not isinstance(app.screen, ConfirmRestart)
        await until_shown(pilot, lambda: rank_row(app, 1).get("state") == "stopped" and
                     rank_row(app, 1)["process"] == "ended" and len(worlds()) == 1)
        await pilot.press("r")  # it joins the running world again, from a standby
        assert not isinstance(app.screen, ConfirmRestart)
        await until_shown(pilot, lambda: len(worlds()) == 2 and rank_row(app, 1)["state"] == "running")
        joined = worlds()[-1]
        # Its script ran its set-up while rank 0 trained on; then they formed the world.
        (preparing,), (prepared,) = ([e["t"] for e in events(log, "rank") if e["rank"] == 1
                                      and e.get("standby") == word] for word in
                                     ("preparing", "prepared"))
        assert any(preparing < e["t"] < prepared for e in events(log, "step") if e["rank"] == 0)
        assert prepared < joined["t"]
        # The joiner takes the world's epoch up at its step: that epoch's row starts there.
        row = lambda: [e for e in events(log, "epoch") if e["rank"] == 1 and  # noqa: E731
                       e["epoch"] == joined["epoch"] and e["t"] > joined["t"]]
        await until_shown(pilot, row)
        pids |= rank_pids(log)
        await pilot.press("r")  # running: it leaves, and a new standby joins in its place
        await until_shown(pilot, lambda: len(worlds()) == 4 and rank_row(app, 1)["state"] == "running")
        pids |= rank_pids(log)
        await pilot.press("k")  # rank 1 is killed: rank 0 recovers alone
        await until_shown(pilot, lambda: len(worlds()) == 5 and
                     rank_row(app, 1).get("state") == "crashed (SIGKILL)")
        recovered = worlds()[-1]
        await until_shown(pilot, lambda: any(e["rank"] == 0 and e["t"] > recovered["t"]
                                        for e in events(log, "step")))
        missing.touch()  # its data is gone: the next joiner's script fails in its set-up
        await pilot.press("r")
        await until_shown(pilot, lambda: len(events(log, "error")) == 2 and "FileNotFoundError" in
                     rank_row(app, 1).get("state", ""))
        failed = events(log, "error")[-1]
        await until_shown(pilot, lambda: any(e["rank"] == 0 and e["t"] > failed["t"] + 0.3
                                        for e in events(log, "step")))
        pids |= rank_pids(log)
        await pilot.press("q")
        await until_shown(pilot, run.done.is_set, 60)
        await pilot.pause(0.3)
    assert run.exit_code == 130
    assert [(e["size"], e["ranks"]) for e in worlds()] == [(1, [0]), (2, [0, 1])] * 2 + [(1, [0])]
    (part,) = row()
    # Its row starts at the join; a join at the epoch's last batch (CI: step 63 of 64) leaves the
    # joiner none of it, since a batch goes whole to one rank: an empty row, every sample once.
    assert part["start_step"] == joined["step"] and part["end_step"] >= joined["step"]
    assert part["samples"] == 0 if part["end_step"] == joined["step"] else part["samples"] > 0
    ended = [(e["rank"], e["state"]) for e in events(log, "rank") if e.get("exit_code") is not None]
    assert ended == [(1, "stopped"), (1, "stopped"), (1, "crashed"), (1, "crashed"), (0, "done")]
    assert "left the world" in [e for e in events(log, "rank") if e["rank"] == 1 and
                                e.get("exit_code") == 0][0]["reason"]
    # Running only when it is: at its first start and in each world it entered, never as a
    # standby whose script got going (three standbys here).
    running = [e for e in events(log, "rank") if e["rank"] == 1 and e["state"] == "running"
               and "control" not in e]
    assert [e.get("world_rank") for e in running] == [None, 1, 1]
    assert [(e["rank"], e["text"]) for e in events(log, "error")] == [
        (1, "killed with k"), (1, "FileNotFoundError: the dataset is not there")]
    # The failed joiner formed no world and sent rank 0 back nowhere: one recovery, the k's.
    assert len([e for e in events(log, "message") if e["text"].startswith("recovered")]) == 1
    assert any("before it joined: the others go on" in e["text"] for e in events(log, "message"))
    steps = [e["global_step"] for e in events(log, "step") if e["rank"] == 0 and
             e["t"] > recovered["t"]]
    assert steps == sorted(steps)
    assert_gone(pids)


@pytest.mark.timeout(150)
def test_a_joiner_killed_as_the_world_forms_with_it_is_survived(script_env,  # noqa: F811
                                                                monkeypatch, tmp_path):
    """A standby killed as its run.elastic() makes the new world's first group, and one killed
    once it said it is prepared: rank 0 goes on alone each time, and the next r joins. Either
    death could leave rank 0 waiting in gloo for the dead joiner's connection (the second inside
    init_process_group, where gloo connects on CPUs) until ddptui's change timeout killed it
    too, and the run was lost."""
    log, dies = tmp_path / "dies.jsonl", tmp_path / "dies"
    monkeypatch.setenv("JOINER_DIES", str(dies))
    config = parse_script_args([DIES, "--cpus", "2", "--log", str(log), "--", "--epochs",
                                "1000", "--samples", "2048", "--image-size", "16", "--step-seconds", "0.02"])
    run = ScriptRun(dataclasses.replace(config, headless=True))
    rank1 = lambda: [e["pid"] for e in events(log, "rank") if e["rank"] == 1  # noqa: E731
                     and e.get("pid")][-1]

    def alone_again(after: float) -> None:
        """A world of rank 0 alone formed after `after`, and rank 0 trains in it."""
        world = wait_for_event(log, lambda e: e["kind"] == "world" and e["rank"] == 0
                               and e["t"] > after)
        assert (world["size"], world["ranks"]) == (1, [0])
        wait_for_event(log, lambda e: e["kind"] == "step" and e["rank"] == 0
                       and e["t"] > world["t"])

    run.start()
    try:
        wait_for_event(log, lambda e: e["kind"] == "step" and e["rank"] == 1)
        pids = rank_pids(log)
        killed = time.time()
        os.kill(rank1(), signal.SIGKILL)
        alone_again(killed)
        dies.touch()
        asked = time.time()
        run.restart_rank(1)
        alone_again(asked)
        dies.unlink()
        pids |= rank_pids(log)
        asked = time.time()
        run.restart_rank(1)
        wait_for_event(log, lambda e: e["kind"] == "rank" and e["rank"] == 1 and
                       e.get("standby") == "prepared" and e["t"] > asked)
        os.kill(rank1(), signal.SIGKILL)
        alone_again(asked)
        pids |= rank_pids(log)
        run.restart_rank(1)
        wait_for_event(log, lambda e: e["kind"] == "world" and e["rank"] == 0
                       and e["size"] == 2 and e["t"] > asked)
        pids |= rank_pids(log)
    finally:
        run.stop()
        code = run.wait(60)
    assert code == 130
    errors = [e["text"] for e in events(log, "error")]
    assert errors == ["killed by SIGKILL"] * 3
    assert_gone(pids)


@pytest.mark.timeout(240)
def test_a_member_killed_just_after_a_joiner_entered_leaves_the_joiner_training(script_env,  # noqa: F811
                                                                               tmp_path):
    """s on rank 1, r, then kill -9 of the other rank 0 to 1 s after the world of 2 formed with
    the joiner in it, before or after the joiner's own `running` report came in: the joiner
    recovers alone and trains on each time (the run failed, "no survivor"), and the killed rank
    joins next."""
    log = tmp_path / "heavy.jsonl"
    config = parse_script_args([HEAVY, "--cpus", "2", "--log", str(log), "--", "--epochs",
                                "1000", "--samples", "2048", "--image-size", "16", "--step-seconds", "0.02"])
    run = ScriptRun(dataclasses.replace(config, headless=True))
    world = lambda: run.world.membership  # noqa: E731
    worlds = lambda: [e for e in events(log, "world") if e["rank"] >= 0]  # noqa: E731

    def alone(slot: int, seen: int) -> None:
        """A world of `slot` alone formed after the first `seen`, and it trains in it."""
        after = worlds()[seen - 1]["t"] if seen else 0
        formed = wait_for_event(log, lambda e: e["kind"] == "world" and e["rank"] >= 0 and
                                e["t"] > after or e["kind"] == "run" and e["status"] != "started",
                                120)
        assert formed.get("ranks") == [slot], formed
        wait_for_event(log, lambda e: e["kind"] == "step" and e["rank"] == slot
                       and e["t"] > formed["t"])

    run.start()
    try:
        wait_for_event(log, lambda e: e["kind"] == "step" and e["rank"] == 1
                       and run.world.elastic, 120)
        pids = rank_pids(log)
        run.stop_rank(1)
        alone(0, len(worlds()))
        for delay, joiner, victim in [(0.0, 1, 0), (0.1, 0, 1), (0.3, 1, 0), (1.0, 0, 1)]:
            run.restart_rank(joiner)
            deadline = time.monotonic() + 120
            while not (world().idle() and sorted(world().confirmed) == [0, 1]):  # formed
                assert time.monotonic() < deadline, "the world of 2 never formed"
                time.sleep(0.002)
            time.sleep(delay)
            seen = len(worlds())
            pids |= rank_pids(log)
            os.kill(member_pid(run, victim), signal.SIGKILL)
            alone(joiner, seen)
        pids |= rank_pids(log)
    finally:
        run.stop()
        code = run.wait(60)
    assert code == 130
    assert [e["status"] for e in events(log, "run")][-1] == "interrupted"
    assert [(e["rank"], e["text"]) for e in events(log, "error")] == \
        [(0, "killed by SIGKILL"), (1, "killed by SIGKILL")] * 2
    assert_gone(pids)


def member_pid(run: ScriptRun, slot: int) -> int:
    """The slot's process in the world now, as the run holds it: the log's newest `rank` event
    of the slot may not be written yet (read from it, a loaded suite killed a pid long gone)."""
    (pid,) = [r.pid for r in run.group.alive() if r.slot == slot]
    return pid


@pytest.mark.timeout(120)
def test_a_run_that_ends_while_a_joiner_prepares_ends_cleanly(script_env,  # noqa: F811
                                                              monkeypatch, tmp_path):
    """r after a crash, and the others finish before the joiner is prepared: the run ended
    "done" after "lost the connection ... reset by peer", "rank 1 failed (exit code 137):
    killed by SIGKILL" and "rank 1 killed by SIGKILL before it joined". A joiner ended because
    the run ended is no failure: nothing of it is said, and nothing of it is left."""
    monkeypatch.setenv("PREPARING", str(tmp_path / "preparing"))
    log = tmp_path / "end.jsonl"
    run = script_run([SLOW, "--cpus", "2", "--grace", "10", "--", "--epochs", "3", "--samples",
                "256", "--image-size", "16", "--fail-at-epoch", "1"], log)
    run.start()
    try:
        wait_for_event(log, lambda e: e["kind"] == "world" and e["rank"] == 0
                       and e["size"] == 1, 60)
        run.restart_rank(1)
        standby = wait_for_event(log, lambda e: e["kind"] == "rank" and e.get("standby")
                                 == "warming", 30)
        assert run.done.wait(90), "the run did not end"
        assert any(e.get("standby") == "preparing" for e in events(log, "rank"))
    finally:
        run.stop()
        run.stop()
    assert run.wait(30) == 0
    (error,) = events(log, "error")  # the crash asked for, and nothing after it
    assert error["text"] == "RuntimeError: rank 1 gave up at epoch 1"
    warned = [e["text"] for e in events(log, "message") if e.get("level") != "info"]
    assert not [w for w in warned if "SIGKILL" in w or "lost the connection" in w], warned
    assert [e["status"] for e in events(log, "run")] == ["started", "done"]
    last = [e for e in events(log, "rank") if e["rank"] == 1][-1]
    assert last["state"] == "crashed" and "gave up" in last.get("reason", "")
    assert_gone([standby["pid"], *rank_pids(log)])


def test_a_rank_killed_outside_ddptui_leaves_nothing_behind_when_the_others_go_on(env, tmp_path):
    """kill -9 of a rank (the OOM killer, a segfault) leaves its children: DataLoader workers
    held its output open until their next check of their parent, up to 5 s, and the survivor
    waited for them before it could go on. Here the child would stay for ever."""
    log = tmp_path / "kill.jsonl"
    proc = start_ddptui(["run", CHILD, "--cpus", "2", "--log", str(log), "--", "--epochs",
                         "1000", "--samples", "2048", "--image-size", "16", "--step-seconds", "0.02"],
                        dict(env, OMP_NUM_THREADS="1"), tmp_path)
    try:
        for rank in (0, 1):
            wait_for_event(log, lambda e, rank=rank: e["kind"] == "step" and e["rank"] == rank)
        (rank1,) = {e["pid"] for e in events(log, "rank") if e["rank"] == 1 and e.get("pid")}
        children = {c.pid for c in psutil.Process(rank1).children(recursive=True)}
        assert children, "rank 1's child"
        os.kill(rank1, signal.SIGKILL)
        wait_for_event(log, lambda e: e["kind"] == "world" and e["rank"] == 0 and e["size"] == 1)
        assert not [p for p in children if psutil.pid_exists(p) and
                    psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        (error,) = events(log, "error")
        assert error["rank"] == 1 and error["text"].startswith("killed by SIGKILL")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert_gone(run_pids(log))


def _loader(world: tuple[int, int]) -> LiveLoader:
    live = LiveLoader(TensorDataset(torch.arange(48)), batch_size=4, shuffle=True, device="cpu")
    live.set_world(*world)
    return live


def test_an_elastic_loader_loses_and_repeats_no_sample_across_a_leave_and_a_rollback():
    """Two ranks take 3 steps; rank 1 leaves, rank 0 goes on alone and later goes back two
    steps: the samples trained on, once the redone steps are counted once, are the epoch."""
    ranks = [_loader((0, 2)), _loader((1, 2))]
    its = [iter(live) for live in ranks]
    seen: list[int] = []
    for _ in range(3):
        for live, it in zip(ranks, its, strict=True):
            seen += next(it)[0].tolist()
            live.step_done()
    rank0, it = ranks[0], its[0]
    rank0.set_world(0, 1)  # rank 1 left at the agreed step
    steps = []
    for _ in range(3):
        steps.append(next(it)[0].tolist())
        rank0.step_done()
    point = rank0.consumed - 2 * 4  # a rollback point two steps back
    rank0.restore(point)
    redone = [next(it)[0].tolist(), None]
    rank0.step_done()
    redone[1] = next(it)[0].tolist()
    rank0.step_done()
    assert redone == steps[1:]  # the same batches again, in the same order
    rest = [b[0].tolist() for b in it]
    seen += sum(steps, []) + sum(rest, [])
    assert sorted(seen) == list(range(48))
    assert len(rank0) == 12  # batches in an epoch for a world of one


def test_an_elastic_loader_keeps_the_order_your_distributed_sampler_draws():
    """Under run.elastic the epoch's whole order is what the script's DistributedSampler would
    shuffle (seed + epoch), cut into steps of batch_size x world, each rank its slice."""
    from torch.utils.data import DistributedSampler

    data = TensorDataset(torch.arange(48))
    ranks = []
    for rank in (0, 1):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=5)
        sampler.set_epoch(3)
        live = LiveLoader(data, batch_size=4, sampler=sampler, device="cpu")
        live.set_world(rank, 2)
        ranks.append([b[0].tolist() for b in live])
    order = torch.randperm(48, generator=torch.Generator().manual_seed(5 + 3)).tolist()
    assert ranks[0][0] + ranks[1][0] == order[:8] and ranks[0][1] + ranks[1][1] == order[8:16]
    assert sorted(sum(ranks[0] + ranks[1], [])) == list(range(48))
