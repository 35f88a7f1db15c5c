"""The framework callbacks with the real frameworks, on 2 gloo ranks under `ddptui run`:
each rank's own loss per step, epoch rows with the framework's validation metric, and the
dashboard's c and q reaching every rank at one step (the framework's own checkpoint file)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest

from ddptui.cli import resolve_devices
from ddptui.script.options import parse_script_args
from ddptui.script.run import ScriptRun
from tests.conftest import ROOT, assert_stops_cleanly, epoch_samples, events, wait_for_event

pytest.importorskip("lightning")


@pytest.fixture
def script_env(env, monkeypatch, tmp_path):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)  # where the framework writes its checkpoints


@pytest.mark.timeout(150)
def test_lightning_reports_every_rank_and_takes_c_and_q(script_env, tmp_path):
    log = tmp_path / "lightning.jsonl"
    config = parse_script_args([os.path.join(ROOT, "examples", "lightning_ddp.py"), "--cpus",
                                "2", "--grace", "30", "--log", str(log), "--", "--epochs",
                                "1000"], resolve_devices)
    run = ScriptRun(dataclasses.replace(config, headless=False))
    run.start()
    try:
        first = wait_for_event(log, lambda e: e["kind"] == "epoch" and e["rank"] == 1, 120)
        assert 0 < first["val_acc"] <= 1 and first["val_loss"] > 0 and first["samples"] == 1024
        for rank in (0, 1):
            wait_for_event(log, lambda e, r=rank: e["kind"] == "step" and e["rank"] == r, 30)
        steps = events(log, "step")
        assert all(e.get("source") is None for e in steps)
        # Each rank's own loss, not an average: the two ranks' figures differ.
        last = {e["rank"]: e["loss"] for e in steps}
        assert last[0] != last[1]
        run.checkpoint()
        saved = wait_for_event(log, lambda e: "checkpoint asked for" in e.get("text", ""), 60)
        assert saved["rank"] == 0
        folder = tmp_path / "checkpoints"
        wait_for_event(log, lambda e: e["kind"] == "epoch" and e["epoch"] >= 1 and
                       any(f.name.startswith("ddptui-") for f in folder.glob("*.ckpt")), 60)
        # The module's loader is ddptui's: w then a reach its DataLoader within the epoch.
        assert run.refuse("settings") is None
        run.change_settings(workers=1)
        run.apply_now()
        applied = wait_for_event(log, lambda e: e["kind"] == "settings" and
                                 e.get("status") == "applied" and e["settings"]["workers"] == 1, 60)
        wait_for_event(log, lambda e: e["kind"] == "epoch" and e["epoch"] > applied["epoch"], 60)
        assert set(epoch_samples(log).values()) == {1024}  # none lost or repeated
    except BaseException:
        run.stop()
        run.stop()
        raise
    assert_stops_cleanly(run, log)  # q: trainer.should_stop on every rank at the same step


@pytest.mark.timeout(150)
def test_hugging_face_trainer_reports_every_rank_and_takes_c_and_q(script_env, tmp_path):
    pytest.importorskip("transformers")
    log = tmp_path / "hf.jsonl"
    config = parse_script_args([os.path.join(ROOT, "examples", "hf_trainer.py"), "--cpus", "2",
                                "--grace", "30", "--log", str(log), "--", "--epochs", "1000",
                                "--output-dir", str(tmp_path / "out")], resolve_devices)
    run = ScriptRun(dataclasses.replace(config, headless=False))
    run.start()
    try:
        first = wait_for_event(log, lambda e: e["kind"] == "epoch" and e["rank"] == 1, 120)
        # eval_loss and eval_accuracy, as the Trainer's evaluation named them
        assert first["val_loss"] > 0 and 0 < first["val_acc"] <= 1 and first["samples"] == 1024
        for rank in (0, 1):
            wait_for_event(log, lambda e, r=rank: e["kind"] == "step" and e["rank"] == r, 30)
        steps = events(log, "step")
        last = {e["rank"]: e["loss"] for e in steps}
        assert last[0] != last[1]  # each rank's own loss, before the Trainer gathers it
        run.checkpoint()  # control.should_save on every rank at the same step
        wait_for_event(log, lambda e: e["kind"] == "epoch" and
                       any((tmp_path / "out").glob("checkpoint-*")), 60)
    except BaseException:
        run.stop()
        run.stop()
        raise
    assert_stops_cleanly(run, log)  # q: control.should_training_stop


@pytest.mark.timeout(150)
def test_keras_fit_becomes_data_parallel_reports_every_rank_and_takes_c_and_q(script_env,
                                                                              tmp_path):
    if importlib.util.find_spec("keras") is None:  # importing it here would pick TensorFlow
        pytest.skip("keras is not installed")
    log = tmp_path / "keras.jsonl"
    config = parse_script_args([os.path.join(ROOT, "examples", "keras_fit.py"), "--cpus", "2",
                                "--grace", "30", "--log", str(log), "--", "--epochs", "1000"],
                               resolve_devices)
    run = ScriptRun(dataclasses.replace(config, headless=False))
    run.start()
    try:
        first = wait_for_event(log, lambda e: e["kind"] == "epoch" and e["rank"] == 1, 120)
        # fit()'s val_loss and val_accuracy; each rank trained its half of the 2,048 samples
        assert first["val_loss"] > 0 and 0 < first["val_acc"] <= 1 and first["samples"] == 1024
        for rank in (0, 1):
            wait_for_event(log, lambda e, r=rank: e["kind"] == "step" and e["rank"] == r, 30)
        last = {e["rank"]: e["loss"] for e in events(log, "step")}
        assert last[0] != last[1]  # each rank's own loss
        run.checkpoint()  # model.save on rank 0, at the step every rank agreed
        wait_for_event(log, lambda e: e["kind"] == "epoch" and
                       any((tmp_path / "checkpoints").glob("ddptui-epoch=*.keras")), 60)
    except BaseException:
        run.stop()
        run.stop()
        raise
    assert_stops_cleanly(run, log)  # q: model.stop_training on every rank at one step
    # One training, not two: the gradients were averaged, so both ranks end with rank 0's
    # weights moved by the same steps.
    sums = {(tmp_path / f"keras.rank{r}.out").read_text().split("weights checksum ")[1].split()[0]
            for r in (0, 1)}
    assert len(sums) == 1, sums
