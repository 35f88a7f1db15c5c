"""Every exit path ends every process: a normal end (which also shows resnet18 learning on
the built-in data), SIGTERM, Ctrl-C, the parent SIGKILLed, a rank SIGKILLed. Exit codes and the
JSONL log say what happened."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers.runs import (
    ROOT,
    TINY,
    assert_gone,
    ddptui,
    events,
    run_pids,
    start_ddptui,
    wait_for_event,
)

LONG = [*TINY, "--cpus", "2", "--epochs", "50"]


def test_a_normal_end_learns_logs_every_event_kind_and_leaves_nothing(env, tmp_path, orphans):
    """`make run`'s job, shortened: the built-in shapes (JPEGs decoded in a DataLoader worker per
    rank), headless, a small model (resnet18 took 4x the CPU for the same promises): six epochs
    of 31 steps, and the loss falls clearly (2.09 -> 1.46, val_acc 0.26 -> 0.47 when this was
    written)."""
    log = tmp_path / "x.jsonl"
    r = ddptui(["run", "tests.helpers.userpkg:tiny_cnn", "--cpus", "2", "--headless", "--epochs",
                "6", "--image-size", "32", "--lr", "0.2", "--workers", "1", "--log", str(log)],
               env, tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr
    for kind in ("step", "gpu", "epoch"):
        assert {e["rank"] for e in events(log, kind)} == {0, 1}, kind
    assert {e["state"] for e in events(log, "rank")} >= {"starting", "running", "done"}
    assert [e["status"] for e in events(log, "run")] == ["started", "done"]
    assert events(log, "world")[0]["size"] == 2
    assert "first step" in r.stdout and "done in" in r.stdout and "best val_acc" in r.stdout
    assert orphans() == []  # not even multiprocessing's resource tracker, at the moment of exit
    assert_gone(run_pids(log))
    rank0 = [e for e in events(log, "epoch") if e["rank"] == 0]
    assert len(rank0) == 6
    assert rank0[-1]["train_loss"] < 0.8 * rank0[0]["train_loss"]
    assert rank0[-1]["val_acc"] > 0.2  # ten classes: chance is 0.1


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_in_order_with_a_checkpoint(sig, code, env, tmp_path, orphans):
    log, ck = tmp_path / "x.jsonl", tmp_path / "ck"
    p = start_ddptui(["run", *LONG, "--checkpoint-dir", str(ck), "--log", str(log)], env, ROOT)
    wait_for_event(log, lambda e: e["kind"] == "step" and e.get("global_step", 0) >= 3)
    pids = run_pids(log)
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert events(log, "run")[-1]["status"] == "interrupted"
    assert events(log, "checkpoint"), "an orderly stop writes a final checkpoint"
    assert os.listdir(ck)
    assert orphans() == []
    assert_gone(pids | {p.pid})


def test_parent_killed_takes_every_rank_and_worker_with_it(env, tmp_path):
    log = tmp_path / "x.jsonl"
    args = ["run", *LONG, "--workers", "1", "--log", str(log)]
    p = start_ddptui(args, env, tmp_path)
    wait_for_event(log, lambda e: e["kind"] == "step", timeout=90)
    time.sleep(1.5)  # let the supervisor see the DataLoader workers too
    pids = run_pids(log)
    assert len(pids) >= 5, pids  # parent, two ranks, their workers
    p.kill()
    p.wait()
    assert_gone(pids)  # on their own: PR_SET_PDEATHSIG and the parent watch


WORKERS_THEN_DIE = """
import os, signal, sys
from functools import partial
from torch.utils.data import DataLoader
from ddptui_trainer.pipeline.datasets import worker_init
loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, multiprocessing_context="spawn",
                    worker_init_fn=partial(worker_init, os.getpid()))
it = iter(loader)
with open(sys.argv[1], "w") as f:
    f.write(" ".join(str(w.pid) for w in it._workers))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_workers_whose_rank_dies_while_they_start_end_too(env, tmp_path):
    """A rank killed while its DataLoader workers are still importing torch: they ask for the
    parent-death signal only after it is gone, so they must see that for themselves."""
    said = tmp_path / "pids"
    # No pipes: the workers inherit the script's, and a leak would hang the read, not fail.
    r = subprocess.run([sys.executable, "-c", WORKERS_THEN_DIE, str(said)], env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    assert r.returncode == -signal.SIGKILL
    pids = {int(p) for p in said.read_text().split()}
    assert len(pids) == 2
    assert_gone(pids, timeout=90)


def test_a_rank_killed_without_rollback_points_fails_the_run_quickly_with_the_reason(env,
                                                                                    tmp_path):
    log, scratch = tmp_path / "x.jsonl", tmp_path / "tmp"
    scratch.mkdir()
    p = start_ddptui(["run", *LONG, "--snapshot-every", "0", "--log", str(log)],
                     dict(env, TMPDIR=str(scratch)), ROOT)
    wait_for_event(log, lambda e: e["kind"] == "step")
    pids = run_pids(log)
    victim = next(e["pid"] for e in events(log, "rank") if e["rank"] == 1)
    os.kill(victim, signal.SIGKILL)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert "rank 1 killed by SIGKILL" in err
    assert events(log, "run")[-1]["status"] == "failed"
    assert_gone(pids)
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("ddptui-")]


def test_the_fork_server_killed_ends_the_run_with_that_reason_and_leaves_nothing(env, tmp_path):
    """The ranks are forked from a server that ddptui starts; their exit status comes through
    it, so they die with it: the run fails saying so, not with a bare exit code 255."""
    log = tmp_path / "x.jsonl"
    p = start_ddptui(["run", *LONG, "--log", str(log)], env, ROOT)
    wait_for_event(log, lambda e: e["kind"] == "step")
    pids = run_pids(log)
    server = next(c for c in psutil.Process(p.pid).children() if "forkserver" in " ".join(c.cmdline()))
    server.kill()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1
    assert "fork server it was started from, which died" in err
    assert_gone(pids | {server.pid})


def test_a_rank_that_crashes_is_survived_said_where_and_its_standby_ends_with_the_run(
        env, tmp_path):
    """A segfault (a bad pointer in an extension, say): the reason names the signal and where
    the crashing thread was, from the stacks the rank's faulthandler prints."""
    log = tmp_path / "x.jsonl"
    p = start_ddptui(["run", *LONG, "--epochs", "5000", "--log", str(log)], env, ROOT)
    wait_for_event(log, lambda e: e["kind"] == "step")
    victim = next(e["pid"] for e in events(log, "rank") if e["rank"] == 1)
    os.kill(victim, signal.SIGSEGV)
    wait_for_event(log, lambda e: e["kind"] == "rank" and e.get("standby") == "ready")
    pids = run_pids(log)  # now including the standby that replaced rank 1
    step = max(e["global_step"] for e in events(log, "step") if e["rank"] == 0)
    wait_for_event(log, lambda e: e["kind"] == "step" and e["global_step"] > step + 20)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    crashed = next(e for e in events(log, "rank") if e["rank"] == 1 and e["state"] == "crashed")
    assert crashed["reason"].startswith("killed by SIGSEGV in ") and ".py:" in crashed["reason"]
    assert f"rank 1 {crashed['reason']}: going on with 1 rank" in out
    assert [e["size"] for e in events(log, "world") if e["rank"] >= 0] == [1]
    assert_gone(pids)
