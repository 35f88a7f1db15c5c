"""Live control through the supervisor API, without a terminal: pause holds every rank at the
same step, a checkpoint can be asked for, settings land on every rank at the same epoch, autotune
keeps the fastest setting."""

from __future__ import annotations

import time

from ddptui.contract.options.policy import RunPolicy
from ddptui.run.builtin.supervisor import Supervisor
from tests.helpers.runs import TINY, assert_gone, events, run_config


def _wait(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout} s"
        time.sleep(0.05)


def _steps(sup: Supervisor) -> dict[int, int]:
    return {r.rank: r.global_step for r in sup.state.view().ranks}


def test_pause_checkpoint_and_settings_land_on_every_rank_at_one_step_and_epoch(tmp_path):
    """One run (a run costs the suite two ranks' start-up): pause holds every rank at the same
    step, a checkpoint asked for while paused is written there; then settings land on every rank
    at the same epoch."""
    log, ck = tmp_path / "x.jsonl", tmp_path / "ck"
    sup = Supervisor(run_config(*TINY, "--epochs", "500", "--steps-per-epoch", "12",
                             "--checkpoint-dir", str(ck)), str(log))
    sup.start()
    _wait(lambda: sup.state.first_step_t, "first step")
    sup.pause()
    _wait(lambda: len([e for e in events(log, "run") if e["status"] == "paused"]) == 2, "pause")
    held = {e["rank"]: e["global_step"] for e in events(log, "run") if e["status"] == "paused"}
    assert len(set(held.values())) == 1  # every rank stopped at the same step
    step = held[0]
    time.sleep(1.5)
    assert not [e for e in events(log, "step") if e["global_step"] > step], "stepped while paused"
    assert _steps(sup) == held
    sup.checkpoint()  # honoured while paused too
    # (epoch ends write checkpoints too; the one asked for is at the paused step)
    _wait(lambda: [e for e in events(log, "checkpoint") if e["global_step"] == step],
          "checkpoint at the paused step")
    sup.resume()
    _wait(lambda: min(_steps(sup).values()) > step + 4, "steps after resume")

    sup.change_settings(workers=1, cudnn_benchmark=False)
    assert sup.state.view().pending == {"workers": 1, "cudnn_benchmark": False}
    _wait(lambda: not sup.state.view().pending, "settings applied")
    _wait(lambda: len({e["rank"] for e in events(log, "epoch")
                       if e["settings"]["workers"] == 1}) == 2, "an epoch under the new settings")
    sup.stop()
    assert sup.wait(60) == 130
    first_new = {}
    for e in events(log, "epoch"):
        if e["settings"] == {"prefetch": True, "workers": 1, "cudnn_benchmark": False}:
            first_new.setdefault(e["rank"], e["epoch"])
        else:
            assert e["settings"]["workers"] == 0
            assert e["epoch"] < first_new.get(e["rank"], 10**9)
    assert len(set(first_new.values())) == 1 and min(first_new.values()) >= 1
    (applied,) = [e for e in events(log, "settings") if e.get("status") == "applied"
                  and e["settings"]["workers"] == 1]
    assert applied["epoch"] == first_new[0]
    assert_gone(sup.pids())


def test_autotune_tries_each_setting_as_an_epoch_row_and_keeps_the_fastest(tmp_path, monkeypatch):
    from ddptui.run.builtin import autotune

    # Shorter phases than a real run's: what is tested is the order of trials and the choice
    # (the ranks train flat out meanwhile, 13 s of both cores at the real lengths).
    for name, seconds in (("WARMUP_S", 1.0), ("SETTLE_S", 1.0), ("MEASURE_S", 1.0)):
        monkeypatch.setattr(autotune, name, seconds)
    log = tmp_path / "x.jsonl"
    sup = Supervisor(run_config(*TINY, "--epochs", "5000", "--steps-per-epoch", "64"), str(log),
                     RunPolicy(autotune=True))
    sup.start()
    _wait(lambda: [e for e in events(log, "message") if e.get("autotune")], "the verdict", 90)
    (verdict,) = [e for e in events(log, "message") if e.get("autotune")]
    trials = [e for e in events(log, "message") if e["text"].startswith("autotune trial")]
    assert len(trials) == 2  # 0 and 1 workers on this 2-core machine (no prefetcher on CPU)
    rates = {int(t["text"].split(", ")[1].split()[0]): float(t["text"].rsplit(": ", 1)[1]
                                                              .split()[0].replace(",", ""))
             for t in trials}
    best = verdict["autotune"]["workers"]
    assert rates[best] == max(rates.values())  # as the trials said (a tie at whole img/s: either)
    _wait(lambda: sup.state.view().settings["workers"] == best and
          not sup.state.view().pending, "the kept setting in force")
    applied = [e for e in events(log, "settings") if e.get("status") == "applied"]
    assert {e["settings"]["workers"] for e in applied} == {0, 1}
    sup.stop()
    assert sup.wait(60) == 130
    assert_gone(sup.pids())
