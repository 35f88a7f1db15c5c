"""--notify and --notify-cmd: a hung rank, its recovery and the run's end reach a JSON webhook (a
receiver the test runs) and a command, each once; a receiver that is down costs the run nothing;
--notify-test says whether a message got through."""

from __future__ import annotations

import socket

import pytest

from tests.helpers.monitoring import Receiver
from tests.helpers.runs import ROOT, assert_gone, ddptui, events, local_port, run_pids

HANG = ["tests.helpers.userpkg:tiny_cnn", "--data", "tests.helpers.userpkg:hang_once",
        "--batch-size", "8", "--workers", "0", "--cpus", "2"]
TINY = ["tests.helpers.userpkg:tiny_cnn", "--data", "tests.helpers.userpkg:blobs",
        "--batch-size", "16", "--workers", "0", "--cpus", "2"]


@pytest.fixture
def receiver():
    pytest.importorskip("apprise")
    r = Receiver()
    yield r
    r.close()


@pytest.mark.timeout(240)
def test_a_hung_rank_and_the_runs_end_reach_a_webhook_and_a_command(env, tmp_path, receiver):
    log, said = tmp_path / "n.jsonl", tmp_path / "said.txt"
    env = dict(env, DDPTUI_TEST_HANG_AT="200", DDPTUI_TEST_HANG_RANK="1",
               DDPTUI_TEST_HANG_FLAG=str(tmp_path / "hung"))
    r = ddptui(["run", *HANG, "--epochs", "3", "--stall-after", "2", "--on-stall", "recover",
                "--log", str(log), "--notify", receiver.url, "--notify-cmd",
                f'echo "$DDPTUI_EVENT $DDPTUI_RANK $DDPTUI_RUN" >> {said}'], env, ROOT,
               timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    got = [(b["event"], b["rank"]) for b in receiver.bodies]
    assert got == [("stalled", "1"), ("crashed", "1"), ("done", "")], receiver.bodies
    stalled, crashed, done = receiver.bodies
    assert "block_forever_here" in stalled["text"]  # where its stacks say it is
    assert crashed["text"].startswith("run n: rank 1 ") and "crashed" in crashed["text"]
    assert done["text"].startswith("run n: done in ") and done["log"] == str(log)
    assert {b["run"] for b in receiver.bodies} == {"n"} and all(b["host"] for b in receiver.bodies)
    assert said.read_text().splitlines() == ["stalled 1 n", "crashed 1 n", "done  n"]
    assert receiver.url not in log.read_text()  # the URL is shown masked, never whole
    assert_gone(run_pids(log))


@pytest.mark.timeout(180)
def test_a_receiver_that_is_down_costs_the_run_nothing_and_is_said_once(env, tmp_path):
    pytest.importorskip("apprise")
    log = tmp_path / "d.jsonl"
    down = f"http://127.0.0.1:{local_port()}/hook?token=s3cret"
    r = ddptui(["run", *TINY, "--epochs", "2", "--log", str(log), "--notify", down], env, ROOT,
               timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [e["text"] for e in events(log, "message") if "not delivered" in e.get("text", "")]
    assert len(lines) <= 1  # the run's end may be cut by its exit, never said twice
    assert "s3cret" not in log.read_text() and "s3cret" not in r.stdout + r.stderr
    assert [e["status"] for e in events(log, "run")][-1] == "done"


@pytest.mark.timeout(180)
def test_a_receiver_that_never_answers_costs_the_run_nothing(env, tmp_path):
    """A receiver that accepts and never says a word: the run trains and ends as it would."""
    pytest.importorskip("apprise")
    silent = socket.create_server(("127.0.0.1", 0))
    log = tmp_path / "s.jsonl"
    try:
        r = ddptui(["run", *TINY, "--epochs", "2", "--log", str(log), "--notify",
                    f"http://127.0.0.1:{silent.getsockname()[1]}/hook"], env, ROOT, timeout=150)
    finally:
        silent.close()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "done in" in r.stdout
    assert [e["status"] for e in events(log, "run")][-1] == "done"
    assert_gone(run_pids(log))


def test_notify_test_says_whether_a_message_got_through(env, tmp_path, receiver):
    ok = ddptui(["run", *TINY, "--notify", receiver.url, "--notify-test"], env, tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert receiver.bodies and receiver.bodies[0]["event"] == "test"
    receiver.status = 500
    failed = ddptui(["run", *TINY, "--notify", receiver.url, "--notify-test"], env, tmp_path)
    assert failed.returncode == 1 and "failed" in failed.stderr, failed.stderr
    bad = ddptui(["run", *TINY, "--notify", "nosuch://x"], env, tmp_path)
    assert bad.returncode == 2 and "not a URL Apprise knows" in bad.stderr
    assert not (tmp_path / "runs").exists()  # nothing ran


@pytest.mark.timeout(180)
def test_a_detached_run_notifies_and_serves_its_metrics_with_no_dashboard(env, tmp_path,
                                                                           receiver):
    """--detach: the run's own process keeps the endpoint and sends the end's message, with no
    dashboard attached (the terminal that started it is gone)."""
    from tests.helpers.monitoring import get, until

    log, port = tmp_path / "bg.jsonl", local_port()
    r = ddptui(["run", *TINY, "--epochs", "40", "--detach", "--log", str(log), "--notify",
                receiver.url, "--metrics", str(port)], env, ROOT)
    assert r.returncode == 0, r.stderr
    assert until(lambda: "ddptui_steps_total" in get(f"http://127.0.0.1:{port}/metrics")[1], 90)
    assert until(lambda: [b for b in receiver.bodies if b["event"] == "done"], 150)
    assert_gone(run_pids(log))
