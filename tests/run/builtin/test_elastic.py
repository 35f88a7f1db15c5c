"""Ranks leave, join and die while the run goes on (3 CPU ranks where survivors are needed):
the world re-forms, every sample of an epoch is trained once, and a crash rolls back to exactly
the state an uninterrupted run had."""

from __future__ import annotations

import glob
import os
import signal
import time

import pytest
import torch

from ddptui.contract.options.policy import RunPolicy
from ddptui.run.builtin.supervisor import Supervisor
from tests.helpers.runs import TINY, assert_gone, ddptui, events, run_config


def _wait(predicate, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout} s"
        time.sleep(0.05)


def _worlds(log) -> list[dict]:
    """The world changes the ranks confirmed (the launch's world comes from the supervisor)."""
    return [e for e in events(log, "world") if e["rank"] >= 0]


def _standby(sup: Supervisor, slot: int) -> bool:
    return sup.slots[slot].state.value == "standby"


def _three_ranks_training(tmp_path, monkeypatch, model: str = "tests.helpers.userpkg:tiny_cnn"
                          ) -> tuple[Supervisor, object]:
    """3 CPU ranks of a tiny model (or `model`) at 0.04 s or more a step (4 samples of 0.01 s),
    trained long enough for any number of kills, past their first step; and their log."""
    slow = tmp_path / "slow"
    slow.touch()
    monkeypatch.setenv("DDPTUI_TEST_RECORD", str(tmp_path / "served.txt"))
    monkeypatch.setenv("DDPTUI_TEST_SLOW", str(slow))
    monkeypatch.setenv("DDPTUI_TEST_ITEM_S", "0.01")
    log = tmp_path / "x.jsonl"
    sup = Supervisor(run_config(model, "--data",
                                "tests.helpers.userpkg:recorded", "--batch-size", "4",
                                "--workers", "0", "--epochs", "500", cpus=3), str(log))
    sup.start()
    _wait(lambda: sup.state.first_step_t, "first step")
    return sup, log


@pytest.mark.timeout(240)
def test_every_sample_once_across_stop_restart_apply_and_crash(tmp_path, monkeypatch):
    record, slow = tmp_path / "served.txt", tmp_path / "slow"
    slow.touch()
    monkeypatch.setenv("DDPTUI_TEST_RECORD", str(record))
    monkeypatch.setenv("DDPTUI_TEST_SLOW", str(slow))
    monkeypatch.setenv("DDPTUI_TEST_ITEM_S", "0.004")
    log = tmp_path / "x.jsonl"
    bs = 4
    sup = Supervisor(run_config("tests.helpers.userpkg:tiny_cnn", "--data",
                                "tests.helpers.userpkg:recorded", "--batch-size", str(bs),
                                "--workers", "0", "--epochs", "1", cpus=3), str(log))
    sup.start()
    _wait(lambda: sup.state.first_step_t, "first step")

    sup.stop_rank(1)
    _wait(lambda: len(_worlds(log)) == 1, "the world of 2")
    _wait(lambda: _standby(sup, 1), "rank 1's warm standby")
    sup.restart_rank(1)
    _wait(lambda: len(_worlds(log)) == 2, "the world of 3 again")
    sup.change_settings(cudnn_benchmark=False)
    sup.apply_now()
    _wait(lambda: [e for e in events(log, "settings") if e.get("status") == "applied"
                   and e.get("step")], "settings applied inside the epoch")
    graceful_end = time.time()
    os.kill(sup.slots[2].process.pid, signal.SIGKILL)
    _wait(lambda: len(_worlds(log)) == 3, "the world of 2 after the crash")
    slow.unlink()  # let the rest of the epoch run fast
    assert sup.wait(120) == 0

    assert [(w["size"], w["ranks"]) for w in _worlds(log)] == [
        (2, [0, 2]), (3, [0, 1, 2]), (2, [0, 1])]
    served, probed = [], set()
    for t, pid, i in (line.split() for line in open(record)):
        if pid not in probed:  # each process reads one sample to learn the image shape
            probed.add(pid)
            continue
        served.append((float(t), int(i)))
    before = [i for t, i in served if t < graceful_end]
    assert len(before) == len(set(before)), "a sample served twice across stop/restart/apply"
    # Only the samples of the step the crash broke, and of the steps rolled back, come again.
    (recovered,) = [e for e in events(log, "message") if e.get("redone") is not None]
    indices = [i for _, i in served]
    assert len(indices) - len(set(indices)) <= (recovered["redone"] + 1) * bs * 3
    missing = 3000 - len(set(indices))
    assert 0 <= missing < bs * 3  # at most the last, incomplete global batch
    segments = [e for e in events(log, "epoch") if e["rank"] == 0]
    assert [s["world_size"] for s in segments if s["partial"]][:3] == [3, 2, 3]
    # Validation, sharded over the world that finished the epoch, scores each of 64 once.
    assert [s["val_samples"] for s in segments if not s["partial"]] == [64]
    assert_gone(sup.pids())


@pytest.mark.timeout(240)
def test_crash_rolls_back_to_exactly_the_uninterrupted_state(tmp_path, env):
    """A rank dies in epoch 2; the survivors go back to its start and finish on 2 ranks. That
    must equal resuming the uninterrupted run's own checkpoint of that point on 2 ranks."""
    common = ["tests.helpers.userpkg:tiny_cnn", "--batch-size", "16", "--workers", "0",
              "--epochs", "4", "--steps-per-epoch", "4", "--deterministic", "--headless"]
    x_dir, y_dir = tmp_path / "x", tmp_path / "y"
    # The count includes the one sample each process reads to learn the image shape.
    # Rank 2 dies: rank 0 writes the checkpoints and stays rank 0, so the BatchNorm statistics
    # it broadcasts are the checkpoint's (every rank keeps its own between broadcasts).
    env = dict(env, DDPTUI_TEST_CRASH_AT=str(1 + 9 * 16 + 1),  # while fetching global step 10
               DDPTUI_TEST_CRASH_RANK="2", DDPTUI_TEST_CRASH_FLAG=str(tmp_path / "crashed"))
    x = ddptui(["run", *common, "--data", "tests.helpers.userpkg:crash_once", "--cpus", "3",
                "--snapshot-every", "100", "--checkpoint-dir", str(x_dir),
                "--log", str(tmp_path / "x.jsonl")], env, tmp_path, timeout=200)
    assert x.returncode == 0, x.stderr
    assert os.path.exists(tmp_path / "crashed")
    (recovered,) = [e for e in events(tmp_path / "x.jsonl", "message")
                    if e.get("redone") is not None]
    assert recovered["global_step"] == 8 and recovered["redone"] == 1
    assert [w["size"] for w in _worlds(tmp_path / "x.jsonl")] == [2]

    start = x_dir / "ckpt-e0002-s000000.pt"  # written before the crash, by 3 ranks
    y = ddptui(["run", *common, "--data", "tests.helpers.userpkg:blobs", "--cpus", "2",
                "--resume", str(start), "--checkpoint-dir", str(y_dir),
                "--log", str(tmp_path / "y.jsonl")], env, tmp_path, timeout=200)
    assert y.returncode == 0, y.stderr

    (fx,) = glob.glob(str(x_dir / "ckpt-e0004-*.pt"))
    (fy,) = glob.glob(str(y_dir / "ckpt-e0004-*.pt"))
    a, b = torch.load(fx, weights_only=False), torch.load(fy, weights_only=False)
    assert a["global_step"] == b["global_step"] == 16
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for pid, state in a["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"], b["optimizer"]["state"][pid]["momentum_buffer"])
    assert a["sampler"] == b["sampler"]


@pytest.mark.timeout(180)
def test_stop_rank_0_then_the_last_rank_is_refused(tmp_path):
    log = tmp_path / "x.jsonl"
    sup = Supervisor(run_config(*TINY, "--epochs", "500", "--lr-scaling", "linear"),
                     str(log))
    sup.start()
    _wait(lambda: sup.state.first_step_t, "first step")
    sup.stop_rank(0)
    _wait(lambda: _worlds(log), "the world of 1")
    assert _worlds(log)[0]["ranks"] == [1] and _worlds(log)[0]["rank"] == 1  # the new rank 0
    assert _worlds(log)[0]["base_lr"] == pytest.approx(0.05 * 1)  # linear scaling: 0.05 x world
    step = _worlds(log)[0]["global_step"]
    _wait(lambda: any(e["rank"] == 1 and e["global_step"] > step + 8
                      for e in events(log, "step")), "steps on the world of 1")
    sup.stop_rank(1)
    _wait(lambda: any("last rank" in e.get("text", "") for e in events(log, "message")),
          "the refusal")
    _wait(lambda: _standby(sup, 0), "rank 0's standby")
    sup.stop()
    assert sup.wait(60) == 130
    assert [e["status"] for e in events(log, "run")][-1] == "interrupted"
    assert_gone(sup.pids())


@pytest.mark.timeout(180)
def test_max_restarts_brings_a_killed_rank_back(tmp_path):
    log = tmp_path / "x.jsonl"
    sup = Supervisor(run_config(*TINY, "--epochs", "500"), str(log), RunPolicy(max_restarts=1))
    sup.start()
    _wait(lambda: sup.state.first_step_t, "first step")
    first = sup.slots[1].process.pid
    os.kill(first, signal.SIGKILL)
    _wait(lambda: len(_worlds(log)) == 2, "recovered, then rejoined", timeout=120)
    assert [w["size"] for w in _worlds(log)] == [1, 2]
    assert sup.slots[1].process.pid != first
    _wait(lambda: any(e["rank"] == 1 and e.get("world_size") == 2 and e.get("change_s")
                      for e in events(log, "message")), "the new rank 1 training")
    sup.stop()
    assert sup.wait(60) == 130
    assert_gone(sup.pids())


@pytest.mark.timeout(180)
def test_a_settings_request_lost_with_a_dead_leader_is_asked_again_of_the_next(tmp_path):
    """Rank 0, stopped, holds a request unread in its pipe when it is killed. The survivor,
    now the leader, is asked again and applies it; the view does not keep it pending for ever."""
    log = tmp_path / "x.jsonl"
    sup = Supervisor(run_config(*TINY, "--epochs", "500", "--steps-per-epoch", "8"), str(log))
    sup.start()
    _wait(lambda: sup.state.first_step_t, "first step")
    os.kill(sup.slots[0].process.pid, signal.SIGSTOP)
    sup.change_settings(workers=1)  # into rank 0's pipe, which nobody reads now
    sup.kill_rank(0)
    _wait(lambda: any(e["status"] == "applied" and e["settings"]["workers"] == 1
                      for e in events(log, "settings")), "workers 1 applied", timeout=120)
    assert [w["size"] for w in _worlds(log)] == [1]
    (answer,) = [e for e in events(log, "settings") if e["status"] == "pending"]
    assert answer["rank"] == 1 and answer["settings"]["workers"] == 1
    assert sup.state.vitals().pending == {} and sup.state.vitals().settings["workers"] == 1
    sup.stop()
    assert sup.wait(60) == 130
    assert_gone(sup.pids())


@pytest.mark.timeout(300)
def test_a_member_killed_while_a_standby_joins_is_survived_and_both_join_again(tmp_path,
                                                                               monkeypatch):
    """kill -9 of a member, the leader too, as soon as a standby is told to join: the others
    were forming the world of 3 (rank 0's store waited for the dead one, or the others for rank
    0's store; the join agreed before the death came back after it). They form the smaller
    world at once, and the joiner and the killed rank join again from their standbys."""
    sup, log = _three_ranks_training(tmp_path, monkeypatch)

    def world_without(slot: int, seen: int) -> None:
        _wait(lambda: any(slot not in w["ranks"] for w in _worlds(log)[seen:]),
              f"the world without rank {slot}", timeout=120)

    def rows() -> int:
        return len([e for e in events(log, "epoch") if e.get("partial")])

    def cycle(joiner: int, victim: int, moment: str) -> None:
        seen = len(_worlds(log))
        os.kill(sup.slots[joiner].process.pid, signal.SIGKILL)
        world_without(joiner, seen)
        _wait(lambda: _standby(sup, joiner), f"rank {joiner}'s standby", timeout=120)
        seen, seen_rows = len(_worlds(log)), rows()
        sup.restart_rank(joiner)
        if moment == "ordered":
            _wait(lambda: sup.slots[joiner].state.value == "restarting", "the join ordered")
        else:
            _wait(lambda: rows() > seen_rows, "the segment before the join")
        os.kill(sup.slots[victim].process.pid, signal.SIGKILL)
        world_without(victim, seen)
        _wait(lambda: _standby(sup, victim), f"rank {victim}'s standby", timeout=120)
        seen = len(_worlds(log))
        sup.restart_rank(victim)
        _wait(lambda: any(w["size"] == 3 for w in _worlds(log)[seen:]), "the world of 3",
              timeout=120)

    # Rank 1 dies as soon as the join is ordered, before rank 0 agrees it: the join, dropped,
    # must not be carried out after the recovery. Rank 0 dies as the join is carried out (the
    # others form the world of 3 with it).
    cycle(2, 1, "ordered")
    cycle(1, 0, "changing")
    assert not [e for e in events(log, "rank") if e.get("state") == "stalled"]
    sup.stop()
    assert sup.wait(60) == 130
    assert_gone(sup.pids())


@pytest.mark.timeout(300)
def test_a_rank_killed_at_any_moment_of_a_world_change_is_survived(tmp_path, monkeypatch):
    """s on rank 1, r, then kill -9 of another member 0 to 1 s after the world of 3 formed with
    the joiner in it (the joiner's own `running` report can come in after the kill: it is a
    member all the same; DDP's first steps in a world broadcast outside backward, and a survivor
    waited there for ever for one that had gone on), the leader too: each time the other two,
    the joiner among them, form the world of 2 and train on, and the killed rank joins next."""
    sup, log = _three_ranks_training(tmp_path, monkeypatch, "resnet18")

    def world_without(slot: int, seen: int) -> dict:
        _wait(lambda: any(slot not in w["ranks"] for w in _worlds(log)[seen:]),
              f"the world without rank {slot}", timeout=120)
        return next(w for w in _worlds(log)[seen:] if slot not in w["ranks"])

    def rejoin(slot: int) -> None:
        _wait(lambda: _standby(sup, slot), f"rank {slot}'s standby", timeout=120)
        sup.restart_rank(slot)
        # The moment the supervisor holds the world of 3 as formed, not its log a poll later.
        _wait(lambda: sup.world.idle() and sup.world.confirmed == [0, 1, 2], "the world of 3",
              timeout=120)

    seen = len(_worlds(log))
    sup.stop_rank(1)
    world_without(1, seen)
    for delay, joiner, victim in [(0.0, 1, 2), (0.1, 2, 0), (0.3, 0, 1), (1.0, 1, 2)]:
        rejoin(joiner)
        time.sleep(delay)
        seen = len(_worlds(log))
        os.kill(sup.slots[victim].process.pid, signal.SIGKILL)
        assert joiner in world_without(victim, seen)["ranks"], (delay, joiner, victim)
        _wait(lambda joiner=joiner: any(e["rank"] == joiner and e["t"] > _worlds(log)[-1]["t"]
                                        for e in events(log, "step")), f"rank {joiner} training on")
    worlds = [(w["size"], w["ranks"]) for w in _worlds(log)]
    assert worlds == [(2, [0, 2]), (3, [0, 1, 2]), (2, [0, 1]), (3, [0, 1, 2]), (2, [1, 2]),
                      (3, [0, 1, 2]), (2, [0, 2]), (3, [0, 1, 2]), (2, [0, 1])]
    sup.stop()
    assert sup.wait(60) == 130
    crashed = [e["rank"] for e in events(log, "rank")
               if e.get("state") == "crashed" and e.get("exit_code") is not None]
    assert crashed == [2, 0, 1, 2]  # the killed ranks alone: no joiner lost after them
    assert_gone(sup.pids())
