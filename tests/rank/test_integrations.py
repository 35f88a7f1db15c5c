"""The framework callbacks with the real frameworks, on 2 gloo ranks under `ddptui run`:
each rank's own loss per step, epoch rows with the framework's validation metric, and the
dashboard's space, c and q reaching every rank at one step (the framework's own checkpoint
file)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os

import pytest

from ddptui.contract.options.script import parse_script_args
from ddptui.run.script.run import ScriptRun
from tests.helpers.runs import (
    ROOT,
    assert_gone,
    assert_stops_cleanly,
    epoch_samples,
    events,
    rank_pids,
    wait_for_event,
)

# find_spec, not importorskip: each xdist worker would import Lightning (3 CPU-s) to collect.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="lightning is not installed")


@pytest.fixture
def script_env(script_env, monkeypatch, tmp_path):
    """conftest's, in tmp_path: where the framework writes its checkpoints."""
    monkeypatch.chdir(tmp_path)


def _start_example(name: str, log, *script_args: str) -> ScriptRun:
    """examples/NAME on 2 CPU ranks under `ddptui run` (the dashboard's source, no screen)."""
    config = parse_script_args([os.path.join(ROOT, "examples", name), "--cpus", "2", "--grace",
                                "30", "--log", str(log), "--", "--epochs", "1000", "--step-seconds",
                                "0.02", *script_args])
    run = ScriptRun(dataclasses.replace(config, headless=False))
    run.start()
    return run


def _first_epoch_and_own_losses(log) -> dict:
    """Rank 1's first epoch row, once both ranks reported steps, each with its own loss (the
    two ranks' figures differ: not an average)."""
    first = wait_for_event(log, lambda e: e["kind"] == "epoch" and e["rank"] == 1, 120)
    for rank in (0, 1):
        wait_for_event(log, lambda e, r=rank: e["kind"] == "step" and e["rank"] == r, 30)
    last = {e["rank"]: e["loss"] for e in events(log, "step")}
    assert last[0] != last[1]
    return first


@contextlib.contextmanager
def _ended_on_failure(run: ScriptRun):
    """A failing check stops the run at once (a second stop kills), so nothing outlives it."""
    try:
        yield
    except BaseException:
        run.stop()
        run.stop()
        raise


def _pauses(run: ScriptRun, log) -> None:
    """space: every rank pauses at one step and resumes from it."""
    assert run.capabilities.why_not("pause") is None
    run.pause()
    paused = wait_for_event(log, lambda e: e.get("status") == "paused", 60)
    run.resume()
    resumed = wait_for_event(log, lambda e: e.get("status") == "resumed", 60)
    assert resumed["global_step"] == paused["global_step"]


def _c_saves(run: ScriptRun, log, saved) -> None:
    """c: the framework's own checkpoint file appears (`saved()` lists them) and training
    goes on to another epoch row."""
    run.checkpoint()
    wait_for_event(log, lambda e: e["kind"] == "epoch" and any(saved()), 60)


@pytest.mark.timeout(150)
def test_lightning_reports_every_rank_and_takes_c_and_q(script_env, tmp_path):
    log = tmp_path / "lightning.jsonl"
    run = _start_example("lightning_ddp.py", log)
    with _ended_on_failure(run):
        first = _first_epoch_and_own_losses(log)
        assert 0 < first["val_acc"] <= 1 and first["val_loss"] > 0 and first["samples"] == 1024
        assert all(e.get("source") is None for e in events(log, "step"))
        _pauses(run, log)
        run.checkpoint()
        saved = wait_for_event(log, lambda e: "checkpoint asked for" in e.get("text", ""), 60)
        assert saved["rank"] == 0
        folder = tmp_path / "checkpoints"
        wait_for_event(log, lambda e: e["kind"] == "epoch" and e["epoch"] >= 1 and
                       any(f.name.startswith("ddptui-") for f in folder.glob("*.ckpt")), 60)
        # The module's loader is ddptui's: w then a reach its DataLoader within the epoch.
        assert run.capabilities.why_not("settings") is None
        run.change_settings(workers=1)
        run.apply_now()
        applied = wait_for_event(log, lambda e: e["kind"] == "settings" and
                                 e.get("status") == "applied" and e["settings"]["workers"] == 1, 60)
        wait_for_event(log, lambda e: e["kind"] == "epoch" and e["epoch"] > applied["epoch"], 60)
        assert set(epoch_samples(log).values()) == {1024}  # none lost or repeated
    assert_stops_cleanly(run, log)  # q: trainer.should_stop on every rank at the same step


@pytest.mark.timeout(120)
def test_a_rank_hung_inside_lightnings_fit_is_flagged_with_its_stacks(script_env, tmp_path):
    """Rank 1 hangs in a training step: it is flagged stalled and its stacks name the function
    (inside trainer.fit, under the callback); q then ends everything within the grace."""
    log = tmp_path / "hang.jsonl"
    config = parse_script_args([os.path.join(ROOT, "tests", "helpers", "scripts",
                                             "lightning_hang.py"), "--cpus", "2",
                                "--stall-after", "3", "--grace", "3", "--log", str(log), "--",
                                "--epochs", "1000"])
    run = ScriptRun(dataclasses.replace(config, headless=False))
    run.start()
    with _ended_on_failure(run):
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 1 and e.get("stacks"), 90)
        assert "hang_here" in stacks["text"] and "training_step" in stacks["text"]
        assert any(e["rank"] == 1 and e.get("state") == "stalled" for e in events(log, "rank"))
        pids = rank_pids(log)
        run.stop()
        assert run.wait(60) == 130
    assert_gone(pids)


@pytest.mark.timeout(150)
def test_hugging_face_trainer_reports_every_rank_and_takes_c_and_q(script_env, tmp_path):
    if importlib.util.find_spec("transformers") is None:  # its import costs seconds; ranks do it
        pytest.skip("transformers is not installed")
    log = tmp_path / "hf.jsonl"
    run = _start_example("hf_trainer.py", log, "--output-dir", str(tmp_path / "out"))
    with _ended_on_failure(run):
        first = _first_epoch_and_own_losses(log)  # each rank's, before the Trainer gathers it
        # eval_loss and eval_accuracy, as the Trainer's evaluation named them
        assert first["val_loss"] > 0 and 0 < first["val_acc"] <= 1 and first["samples"] == 1024
        _pauses(run, log)
        # control.should_save on every rank at the same step
        _c_saves(run, log, lambda: (tmp_path / "out").glob("checkpoint-*"))
    assert_stops_cleanly(run, log)  # q: control.should_training_stop


@pytest.mark.timeout(150)
def test_keras_fit_becomes_data_parallel_reports_every_rank_and_takes_c_and_q(script_env,
                                                                              tmp_path):
    if importlib.util.find_spec("keras") is None:  # importing it here would pick TensorFlow
        pytest.skip("keras is not installed")
    log = tmp_path / "keras.jsonl"
    run = _start_example("keras_fit.py", log)
    with _ended_on_failure(run):
        first = _first_epoch_and_own_losses(log)
        # fit()'s val_loss and val_accuracy; each rank trained its half of the 2,048 samples
        assert first["val_loss"] > 0 and 0 < first["val_acc"] <= 1 and first["samples"] == 1024
        _pauses(run, log)
        # model.save on rank 0, at the step every rank agreed
        _c_saves(run, log, lambda: (tmp_path / "checkpoints").glob("ddptui-epoch=*.keras"))
    assert_stops_cleanly(run, log)  # q: model.stop_training on every rank at one step
    # One training, not two: the gradients were averaged, so both ranks end with rank 0's
    # weights moved by the same steps.
    sums = {(tmp_path / f"keras.rank{r}.out").read_text().split("weights checksum ")[1].split()[0]
            for r in (0, 1)}
    assert len(sums) == 1, sums
