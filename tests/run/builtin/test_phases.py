"""Where the built-in loop's step time goes, on 2 gloo ranks: its phases (every one of them,
the host-to-device copy too) add up; a model slow on rank 1 makes the verdict printed after the
exit line name rank 1 and its forward, as its `slow` state did while it ran; `ddptui report`
says the same from the log, and
`ddptui compare` puts that run beside an even one.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import ddptui, events
from tests.run.script.test_phases_scripts import assert_phases_add_up

DATA = ["--data", "tests.helpers.userpkg:many_blobs", "--batch-size", "16", "--workers", "0",
        "--cpus", "2", "--epochs", "1"]
ALL_PHASES = ["data", "h2d", "forward", "backward", "comm", "optimizer", "rest"]


@pytest.mark.timeout(300)
def test_the_verdict_report_and_compare_of_a_slow_and_an_even_run(env, tmp_path):
    slow, even = tmp_path / "slow.jsonl", tmp_path / "even.jsonl"
    r = ddptui(["run", "tests.helpers.userpkg:slow_forward_cnn", *DATA, "--log", str(slow)],
               env, tmp_path, timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("done in"))
    verdict = lines[end + 1:]
    assert verdict[0].startswith("verdict: tests.helpers.userpkg:slow_forward_cnn done"), verdict
    assert any(line.startswith("  slowest: rank 1:") and "its forward" in line
               for line in verdict), verdict
    assert [e["kind"] for e in events(slow)][-2:] == ["verdict", "run"]
    # The ranks table's state says it as it happens, by the same rule and with the phase.
    flagged = [e for e in events(slow, "rank") if e["state"] == "slow"]
    assert flagged and {e["rank"] for e in flagged} == {1}, flagged
    assert flagged[0]["phase"] == "forward" and flagged[0]["cause"] == "compute", flagged[0]
    assert "slower than the median; its forward" in flagged[0]["reason"], flagged[0]
    windows = events(slow, "phases")
    assert {tuple(w["measured"]) for w in windows} == {tuple(ALL_PHASES)}
    assert_phases_add_up(slow)

    report = json.loads(ddptui(["report", str(slow), "--json"], env, tmp_path).stdout)
    assert report["slowest"]["rank"] == 1 and report["slowest"]["phase"] == "forward"
    assert report["measured"] == ALL_PHASES and report["status"] == "done"

    r = ddptui(["run", "tests.helpers.userpkg:tiny_cnn", *DATA, "--log", str(even)], env,
               tmp_path, timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not [e for e in events(even, "rank") if e["state"] == "slow"]
    side = ddptui(["compare", str(slow), str(even)], env, tmp_path)
    assert side.returncode == 0, side.stderr
    rows = {line.split("  ")[0].strip(): line for line in side.stdout.splitlines()}
    assert "slow.jsonl" in side.stdout.splitlines()[0] and "even.jsonl" in side.stdout
    assert "rank 1: forward" in rows["slowest"], rows["slowest"]
    assert rows["img/s"].endswith("%")  # B against A
    both = json.loads(ddptui(["compare", str(slow), str(even), "--json"], env, tmp_path).stdout)
    assert both["a"]["slowest"]["rank"] == 1 and both["b"]["log"] == str(even)


def test_report_of_no_log_and_of_a_file_that_is_not_one_is_one_line_and_exit_2(env, tmp_path):
    r = ddptui(["report", "no-such-run"], env, tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no log file" in r.stderr
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    r = ddptui(["compare", str(other), str(other)], env, tmp_path)
    assert r.returncode == 2 and "is not a ddptui log" in r.stderr, r.stderr
