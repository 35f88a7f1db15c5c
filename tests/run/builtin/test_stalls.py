"""Hung ranks and stragglers on real 2-rank gloo runs: a stalled rank is flagged with what can be
seen from outside and its stacks, the other shows waiting, k (or --on-stall recover) takes the
run on without it, a quit does not wait for it; a slow input pipeline is named; corrupt samples
are skipped and counted."""

from __future__ import annotations

import os
import signal

import pytest
from PIL import Image

from ddptui.contract.options.policy import RunPolicy
from ddptui.dashboard.view.app import DashboardApp
from ddptui.run.builtin.supervisor import Supervisor
from tests.helpers.runs import (
    ROOT,
    TINY,
    assert_gone,
    ddptui,
    events,
    run_config,
    run_pids,
    start_ddptui,
    wait_for_event,
)
from tests.helpers.screens import until

HANG = ["tests.helpers.userpkg:tiny_cnn", "--data", "tests.helpers.userpkg:hang_once",
        "--batch-size", "8", "--workers", "0", "--cpus", "2"]


def _rank_state(log, rank: int, state: str):
    return lambda e: e["kind"] == "rank" and e["rank"] == rank and e.get("state") == state


def _worlds(log) -> list[int]:
    return [e["size"] for e in events(log, "world") if e["rank"] >= 0]



@pytest.mark.timeout(240)
async def test_sigstop_is_flagged_stalled_the_peer_waiting_and_k_goes_on_without_it(tmp_path):
    log = tmp_path / "live.jsonl"
    sup = Supervisor(run_config(*TINY, "--epochs", "500", "--steps-per-epoch", "64"), str(log),
                     RunPolicy(stall_after=2.0))
    app = DashboardApp(sup)

    def state(rank: int) -> str:
        return next(r.state for r in app.view.ranks if r.rank == rank)

    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.view and app.view.status == "running"
                     and len(app.view.ranks) == 2, "a running world of 2")
        victim = sup.slots[1].process.pid
        os.kill(victim, signal.SIGSTOP)
        await until(pilot, lambda: state(1) == "stalled" and state(0) == "waiting",
                     "rank 1 stalled, rank 0 waiting")
        stalled = wait_for_event(log, _rank_state(log, 1, "stalled"), timeout=10)
        assert stalled["process"] == "stopped" and stalled["seconds"] >= 2.0
        waiting = wait_for_event(log, _rank_state(log, 0, "waiting"), timeout=10)
        assert waiting["waiting_for"] == [1]
        assert app.rank_table.get_row_at(1)[1].plain.startswith("stalled")
        await pilot.press("down", "k")
        await until(pilot, lambda: app.view.meta["world_size"] == 1, "the world of 1")
        step = max(e["global_step"] for e in events(log, "step") if e["rank"] == 0)
        await until(pilot, lambda: any(e["global_step"] > step + 5 for e in events(log, "step")
                                        if e["rank"] == 0), "steps on 1 rank")
        assert state(0) == "running"
        assert next(r for r in app.view.ranks if r.rank == 1).state == "crashed"
        pids = sup.pids()
        await pilot.press("q")
        await until(pilot, lambda: sup.done.is_set(), "quit", timeout=60)
    assert sup.exit_code == 130
    crashed = [e for e in events(log, "rank") if e["rank"] == 1 and e["state"] == "crashed"]
    assert "killed by ddptui (k: stalled)" in crashed[0]["reason"]
    assert_gone(pids)


@pytest.mark.timeout(240)
def test_on_stall_recover_shows_where_it_hung_and_goes_on_alone(env, tmp_path):
    log = tmp_path / "x.jsonl"
    env = dict(env, DDPTUI_TEST_HANG_AT="200", DDPTUI_TEST_HANG_RANK="1",
               DDPTUI_TEST_HANG_FLAG=str(tmp_path / "hung"))
    r = ddptui(["run", *HANG, "--epochs", "3", "--stall-after", "2", "--on-stall", "recover",
                "--log", str(log)], env, ROOT, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    stacks = [e for e in events(log, "message") if e.get("stacks_of") == 1]
    assert stacks and "block_forever_here" in stacks[0]["stacks"]
    assert "rank 1 is in block_forever_here" in r.stdout  # headless says where it is stuck
    kinds = [(e["rank"], e.get("state")) for e in events(log, "rank")]
    assert kinds.index((1, "stalled")) < kinds.index((1, "crashed"))
    assert (0, "waiting") in kinds
    assert _worlds(log) == [1]
    assert_gone(run_pids(log))


@pytest.mark.timeout(240)
def test_a_quit_does_not_wait_for_a_stalled_rank_and_checkpoints_from_a_live_one(env, tmp_path):
    log, ck = tmp_path / "x.jsonl", tmp_path / "ck"
    p = start_ddptui(["run", *TINY, "--cpus", "2", "--epochs", "500", "--stall-after", "2",
                      "--checkpoint-dir", str(ck), "--log", str(log)], env, ROOT)
    wait_for_event(log, lambda e: e["kind"] == "step" and e.get("global_step", 0) >= 10)
    pids = run_pids(log)
    victim = next(e["pid"] for e in events(log, "rank") if e["rank"] == 1)
    os.kill(victim, signal.SIGSTOP)
    wait_for_event(log, _rank_state(log, 1, "stalled"), timeout=60)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "ranks did not stop in time" not in out
    written = [e for e in events(log, "checkpoint")]
    assert written and written[-1]["rank"] == 0 and os.listdir(ck)
    assert events(log, "run")[-1]["status"] == "interrupted"
    assert_gone(pids | {p.pid})


@pytest.mark.timeout(240)
async def test_a_straggler_is_flagged_slow_with_cause_data_wait_and_s_takes_it_out(tmp_path,
                                                                                 monkeypatch):
    """Rank 1's input pipeline is slow: it is flagged `slow` (cause data-wait), rank 0 never is.
    `s` on it, a user's first answer to a straggler, takes it out (the key used to refuse any
    rank not shown exactly `running`) and rank 0 goes on alone."""
    monkeypatch.setenv("DDPTUI_TEST_SLOW_S", "0.004")
    monkeypatch.setenv("DDPTUI_TEST_SLOW_RANK", "1")
    log = tmp_path / "x.jsonl"
    sup = Supervisor(run_config(*TINY, "--data", "tests.helpers.userpkg:slow_on_one_rank",
                                "--epochs", "50"), str(log))
    app = DashboardApp(sup)

    def state(rank: int) -> str:
        return next((r.state for r in app.view.ranks if r.rank == rank), "")

    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.view and state(1) == "slow", "rank 1 flagged slow", 120)
        pids = sup.pids()
        await pilot.press("down", "s")
        await until(pilot, lambda: _worlds(log)[-1:] == [1] and state(1) == "stopped",
                     "rank 1 stopped, a world of 1")
        await pilot.press("q")
        await until(pilot, sup.done.is_set, "quit", timeout=60)
    slow = next(e for e in events(log, "rank") if e["rank"] == 1 and e["state"] == "slow")
    assert slow["cause"] == "data-wait", slow
    assert not [e for e in events(log, "rank") if e["rank"] == 0 and e["state"] == "slow"]
    assert sup.exit_code == 130
    assert_gone(pids)


@pytest.mark.timeout(180)
def test_ranks_waiting_for_their_input_are_told_which_knob_may_help(env, tmp_path):
    """Every rank's samples are slow and the ranks load them themselves (--workers 0): the
    events say the input holds both back, once, with W as the knob, and so does the console."""
    log = tmp_path / "x.jsonl"
    env = dict(env, DDPTUI_TEST_SLOW_S="0.003", DDPTUI_TEST_SLOW_RANK="all")
    r = ddptui(["run", *TINY, "--data", "tests.helpers.userpkg:slow_on_one_rank", "--cpus", "2",
                "--epochs", "1", "--log", str(log)], env, ROOT, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    said = [e for e in events(log, "message") if "input_wait" in e]
    assert len(said) == 1, said
    assert said[0]["input_wait"]["ranks"] == [0, 1] and said[0]["input_wait"]["knob"] == "W"
    assert said[0]["input_wait"]["data_wait"] > 0.5 and said[0]["level"] == "warning"
    assert "input holds ranks 0, 1 back" in r.stdout
    assert "W may help: no DataLoader workers" in r.stdout


def _jpegs(root, per_class: int = 12) -> None:
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (40, 40), (i * 20, 100 if cls == "a" else 0, 0)).save(
                root / cls / f"{i}.jpg")


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_corrupt_samples_are_skipped_counted_and_named_once(env, tmp_path, decode):
    _jpegs(tmp_path / "imgs")
    good = (tmp_path / "imgs" / "a" / "1.jpg").read_bytes()
    truncated, text = tmp_path / "imgs" / "a" / "2.jpg", tmp_path / "imgs" / "b" / "5.jpg"
    # With --decode gpu its header reads in the worker and the rank's codec finds it broken.
    truncated.write_bytes(good[:len(good) // 3])
    text.write_text("not an image at all\n")
    log = tmp_path / "x.jsonl"
    # torchvision's decode_jpeg fails the whole batch for the truncated file: the rank decodes
    # that batch's images one by one and skips the broken one.
    r = ddptui(["run", "tests.helpers.userpkg:tiny_cnn", "--cpus", "2", "--data",
                f"imagefolder:{tmp_path / 'imgs'}", "--batch-size", "4", "--workers", "1",
                "--decode", decode, "--epochs", "2", "--max-bad-samples", "5",
                "--log", str(log)], env, ROOT, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    named = [e["path"] for e in events(log, "message") if e.get("bad_sample")]
    assert sorted(set(named)) == sorted([str(truncated), str(text)])
    assert len(named) == len(set(named))  # each named once, however often it is met
    per_epoch = {}
    for e in events(log, "epoch"):
        per_epoch[e["epoch"]] = per_epoch.get(e["epoch"], 0) + e["bad_samples"]
    assert per_epoch[0] >= 1 and sum(per_epoch.values()) >= 2
    if decode == "gpu":
        (said,) = {e["decoder"] for e in events(log, "message") if e.get("decoder")}
        assert said == "torchvision libjpeg (whole images)"
    assert_gone(run_pids(log))


def test_too_many_corrupt_samples_end_the_run_with_exit_2_after_a_checkpoint(env, tmp_path):
    _jpegs(tmp_path / "imgs")
    for i in range(3):
        (tmp_path / "imgs" / "a" / f"{i}.jpg").write_text("junk")
    r = ddptui(["run", "tests.helpers.userpkg:tiny_cnn", "--cpus", "2", "--data",
                f"imagefolder:{tmp_path / 'imgs'}", "--batch-size", "4", "--workers", "1",
                "--epochs", "3", "--max-bad-samples", "1", "--checkpoint-dir",
                str(tmp_path / "ck"), "--log", str(tmp_path / "x.jsonl")], env, ROOT, timeout=150)
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "more than --max-bad-samples 1" in line and "imgs/a/" in line
    assert os.listdir(tmp_path / "ck")
