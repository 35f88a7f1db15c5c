"""Where a script's step time goes, on 2 gloo ranks: with ddptui's three lines (`--api`) and
with none (the hooks installed at the rank's start). Rank 1 is made slow in one phase; the
verdict printed after the exit line, the `phases` events in the log and `ddptui report --json`
say which rank and which phase, and whom the others wait for in all-reduce.

What a script with no ddptui line shows: data-wait (DataLoader's batches), forward and backward
(DDP's hooks), the all-reduce left after backward (a comm hook), the optimizer (torch.optim's
hooks) and the rest; the copy to the device is the script's own code, inside rest, and said so.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers.runs import ROOT, ddptui, events

PHASED = os.path.join(ROOT, "tests", "helpers", "scripts", "phased.py")
SCRIPT_PHASES = ["data", "forward", "backward", "comm", "optimizer", "rest"]
MODES = [pytest.param([], id="no-code-change"), pytest.param(["--api"], id="three-lines")]


def run_phased(env, tmp_path, name: str, *args: str) -> tuple[str, dict]:
    """The script's run to its end: ddptui's own lines (stderr: stdout is the ranks'), and
    `ddptui report --json` of its log."""
    log = tmp_path / f"{name}.jsonl"
    r = ddptui(["run", "--cpus", "2", "--log", str(log), PHASED, "--", *args], env, tmp_path,
               timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]
    report = ddptui(["report", str(log), "--json"], env, tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    return r.stderr, json.loads(report.stdout)


def assert_phases_add_up(log) -> None:
    """The phases of each window add up to its step time, and the windows of an epoch (after
    its first) cover the wall time between their events within 10%: no time of a step is lost
    or counted twice, and rest is not most of it."""
    checked = 0
    for rank in (0, 1):
        windows = [e for e in events(log, "phases") if e["rank"] == rank]
        for w in windows:
            assert abs(sum(v[0] for v in w["phases"].values()) - w["step_ms"]) <= 0.1 * w[
                "step_ms"], w
        for epoch in {w.get("epoch") for w in windows}:
            span = [w for w in windows if w.get("epoch") == epoch]
            if len(span) < 3:
                continue
            stepped = sum(w["steps"] * w["step_ms"] for w in span[1:]) / 1000
            wall = span[-1]["t"] - span[0]["t"]
            assert abs(stepped - wall) <= 0.1 * wall, (rank, epoch, stepped, wall)
            checked += 1
        rest = sum(w["steps"] * w["phases"]["rest"][0] for w in windows) / sum(
            w["steps"] * w["step_ms"] for w in windows)
        assert rest < 0.5, rest
    assert checked >= 2, "no epoch long enough to check"


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", MODES)
def test_a_slow_forward_on_rank_1_is_named_and_rank_0_waits_for_it(env, tmp_path, mode):
    said, report = run_phased(env, tmp_path, "forward", "--slow", "forward", "--epochs", "2",
                              "--steps", "120", *mode)
    assert report["slowest"]["rank"] == 1 and report["slowest"]["phase"] == "forward", report
    assert report["measured"] == SCRIPT_PHASES  # no h2d: the script's own copy is in rest
    lines = said.splitlines()
    verdict = lines[next(i for i, line in enumerate(lines) if line.startswith("verdict: ")):]
    assert verdict[0].startswith("verdict: phased.py done"), said[-2000:]
    assert any(line.startswith("  slowest: rank 1:") and "its forward" in line
               for line in verdict), verdict
    assert "  not told apart here (in rest): host-to-device copy" in verdict
    logged = events(tmp_path / "forward.jsonl")
    kinds = [e["kind"] for e in logged]
    assert kinds[-2:] == ["verdict", "run"], kinds[-5:]  # kept in the log, before the end
    assert logged[-2]["lines"] == verdict
    assert_phases_add_up(tmp_path / "forward.jsonl")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", MODES)
def test_a_slow_dataset_on_rank_1_is_data_wait(env, tmp_path, mode):
    _, report = run_phased(env, tmp_path, "data", "--slow", "data", *mode)
    assert report["slowest"]["rank"] == 1 and report["slowest"]["phase"] == "data", report
    shares = report["per_rank"]
    assert shares["1"]["phases"]["data"] > 0.5 > shares["0"]["phases"]["data"], shares


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", MODES)
def test_rank_1_asleep_after_its_backward_makes_rank_0_wait_in_all_reduce_for_it(
        env, tmp_path, mode):
    """Rank 1 sleeps 30 ms a step between its backward and its optimizer step: rank 0 waits
    for it at the next step's all-reduce, at least half that time a step longer than rank 1
    waits there. (Both ranks of one run: a busy machine slows both alike; set against another
    run, its load at the time was the difference.)"""
    _, late = run_phased(env, tmp_path, "late", "--slow", "after-backward", *mode)

    def comm_ms(rank: str) -> float:
        figures = late["per_rank"][rank]
        return figures["step_ms"] * figures["phases"]["comm"]

    assert comm_ms("0") - comm_ms("1") >= 15, late["per_rank"]
    assert any(f.startswith("rank 0 waits") and f.endswith("for rank 1")
               for f in late["findings"]), late["findings"]
    assert late["slowest"]["rank"] == 1 and late["slowest"]["phase"] == "rest", late


@pytest.mark.timeout(200)
def test_a_rank_that_keeps_a_tensor_an_epoch_is_flagged_for_memory_creep(env, tmp_path):
    """Rank 1 keeps 64 MiB more each of 6 epochs (resident memory: CPU ranks)."""
    _, report = run_phased(env, tmp_path, "creep", "--api", "--epochs", "6", "--steps", "150",
                           "--keep-mib", "64")
    creeping = [f for f in report["findings"] if "memory peak" in f]
    assert len(creeping) == 1 and creeping[0].startswith("rank 1: memory peak +"), report
    assert "MiB an epoch: out of memory in about" in creeping[0]


@pytest.mark.timeout(200)
def test_the_step_clock_turned_off_times_nothing_and_the_verdict_says_so(env, tmp_path):
    """DDPTUI_STEP_CLOCK=0 (to measure what the clock costs: bench/)."""
    said, report = run_phased(dict(env, DDPTUI_STEP_CLOCK="0"), tmp_path, "off", "--api",
                              "--epochs", "1")
    assert not events(tmp_path / "off.jsonl", "phases") and report["phases"] == {}
    assert "  no phases were measured (no DDP model's step was seen, or DDPTUI_STEP_CLOCK=0)" \
        in said.splitlines()
