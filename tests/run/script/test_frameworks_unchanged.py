"""Framework scripts with no line written for ddptui, run as their users run them: Lightning with
ddp gets its callback's figures (each rank's loss, epoch rows with validation); Lightning's
ddp_spawn and accelerate's launcher, which start ranks from inside the library, are seen when
they do and run once as their launcher, each rank shown; the Hugging Face Trainer gets its
callback's figures."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.helpers.runs import ROOT, assert_gone, ddptui, events, run_pids

SCRIPTS = os.path.join(ROOT, "tests", "helpers", "scripts")


def _env(env: dict) -> dict:
    return dict(env, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


def _each_ranks_rows(log, count: int) -> dict[int, list[dict]]:
    rows = {rank: [e for e in events(log, "epoch") if e["rank"] == rank] for rank in (0, 1)}
    assert {rank: len(r) for rank, r in rows.items()} == {0: count, 1: count}, rows
    return rows


def _timed_by_phase(log) -> None:
    """The framework's DDP model and optimizer steps were seen: each rank's steps have their
    forward, backward, all-reduce wait and optimizer (its closure's backward inside the step:
    what follows is the optimizer's), and the run's verdict is in its log."""
    for rank in (0, 1):
        windows = [e for e in events(log, "phases") if e["rank"] == rank]
        assert windows and all(sum(w["phases"][p][0] for w in windows) > 0 for p in
                               ("forward", "backward", "comm", "optimizer")), windows
    assert events(log, "verdict")


def _joined(log) -> dict[int, int]:
    """rank -> pid of the process that joined a process group as it (under a launcher)."""
    return {e["rank"]: e["pid"] for e in events(log, "rank")
            if e["rank"] >= 0 and "joined a process group" in e.get("reason", "")}


lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                               reason="lightning is not installed")


@lightning
def test_lightning_with_ddp_and_no_callback_shows_each_ranks_loss_and_epochs(env, tmp_path):
    log = tmp_path / "ddp.jsonl"
    r = ddptui(["run", "--cpus", "2", "--log", str(log),
                os.path.join(SCRIPTS, "lightning_plain.py"), "ddp"], _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "added ddptui's Lightning callback" in r.stderr
    assert "progress bar is its TQDM one" in r.stderr
    steps = events(log, "step")
    assert {e["rank"] for e in steps} == {0, 1} and all(e.get("source") != "output" for e in steps)
    for rows in _each_ranks_rows(log, 3).values():
        assert [e["epoch"] for e in rows] == [0, 1, 2]
        assert all(e["val_loss"] is not None and e["val_acc"] is not None for e in rows)
    assert not [e for e in events(log, "rank") if e.get("state") in ("stalled", "waiting")]
    _timed_by_phase(log)


@lightning
@pytest.mark.parametrize("count", [[], ["--nproc-per-node", "1"]], ids=["no-count", "nproc-1"])
def test_lightnings_ddp_spawn_runs_once_as_the_launcher_of_its_two_ranks(env, tmp_path, count):
    log = tmp_path / "spawn.jsonl"
    r = ddptui(["run", *count, "--log", str(log), os.path.join(SCRIPTS, "lightning_plain.py"),
                "ddp_spawn"], _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [e["text"] for e in events(log, "message") if "starts its own ranks" in e["text"]]
    assert said and "torch.multiprocessing.start_processes, called from lightning/" in said[0]
    joined = _joined(log)
    assert sorted(joined) == [0, 1] and len(set(joined.values())) == 2
    _each_ranks_rows(log, 3)
    assert [e["status"] for e in events(log, "run")][-1] == "done"
    assert_gone(run_pids(log) | set(joined.values()))


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_the_hugging_face_trainer_with_no_callback_shows_each_ranks_loss_and_evaluation(
        env, tmp_path):
    log = tmp_path / "hf.jsonl"
    r = ddptui(["run", "--cpus", "2", "--log", str(log), os.path.join(SCRIPTS, "hf_plain.py")],
               _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "added ddptui's Hugging Face Trainer callback" in r.stderr
    assert {e["rank"] for e in events(log, "step")} == {0, 1}
    for rows in _each_ranks_rows(log, 2).values():
        assert all(e["val_loss"] is not None for e in rows)
    _timed_by_phase(log)


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None,
                    reason="accelerate is not installed")
def test_accelerates_launcher_with_no_count_runs_once_and_shows_its_ranks(env, tmp_path):
    """`ddptui run -m accelerate.commands.launch --multi_gpu --num_processes 2 script.py`: two
    copies of the launcher each made a world of 2 before (and failed, blamed on a row of '=')."""
    log = tmp_path / "accelerate.jsonl"
    r = ddptui(["run", "--log", str(log), "-m", "accelerate.commands.launch", "--multi_gpu",
                "--num_processes", "2", os.path.join(SCRIPTS, "accelerate_plain.py")],
               _env(env), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [e["text"] for e in events(log, "message") if "starts its own ranks" in e["text"]]
    assert len(said) == 1 and "elastic launch, called from accelerate/" in said[0]
    joined = _joined(log)
    assert sorted(joined) == [0, 1]
    rows = [e for e in events(log, "epoch") if e["rank"] == 0]  # accelerator.print: rank 0
    assert [(e["epoch"], e["val_acc"] is not None) for e in rows] == [(0, True), (1, True)]
    assert_gone(run_pids(log) | set(joined.values()))
