"""Runs launched by torchrun (two agents playing two nodes, loopback only) or by SLURM's
variables, reporting to `ddptui attach`: authenticated, and never in training's way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from ddptui.contract.channel import MAX_MESSAGE
from ddptui.contract.protocol.orders import Pause, Resume
from ddptui.dashboard.sources.attach import Attach
from tests.helpers.runlogs import logged
from tests.helpers.runs import REPORT_KEY, ROOT, TINY, assert_gone, events, local_port, wait_for_event


def _torchrun(node_rank: int, nnodes: int, rdzv: int, args: list[str], env: dict, cwd,
              nproc: int = 1) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
         "--node-rank", str(node_rank), "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{rdzv}", "--rdzv-id", "ddptui-test", "-m", "ddptui_trainer",
         "--", *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


@pytest.mark.timeout(240)
def test_two_torchrun_nodes_report_to_one_attach(keyed_env, tmp_path):
    listen = f"127.0.0.1:{local_port()}"
    log = tmp_path / "attach.jsonl"
    attach = subprocess.Popen([sys.executable, "-m", "ddptui", "attach", "--headless", "--listen",
                               listen, "--log", str(log)], env=keyed_env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rdzv = local_port()
    args = [*TINY, "--epochs", "3", "--report", listen]
    nodes = [_torchrun(n, 2, rdzv, args, keyed_env, tmp_path) for n in (0, 1)]
    for node in nodes:
        out, err = node.communicate(timeout=180)
        assert node.returncode == 0, err[-2000:]
    out, err = attach.communicate(timeout=30)
    assert attach.returncode == 0, err
    assert f"listening on {listen}" in out
    evs = events(log)
    assert {e["rank"] for e in evs if e["kind"] == "step"} == {0, 1}
    assert {e["node"].rsplit("/", 1)[1] for e in evs if e.get("node")} == {"0", "1"}
    assert [e["status"] for e in evs if e["kind"] == "run"] == ["started", "done"]
    assert len([e for e in evs if e["kind"] == "epoch"]) == 6  # 3 epochs x 2 ranks


@pytest.mark.timeout(120)
def test_a_script_with_one_rank_reporting_runs_on_with_control_off(keyed_env, tmp_path):
    """Rank 0 reports to attach, rank 1 has no link (DDPTUI_REPORT on one node only): the script
    runs to its end and the dashboard says live control is off (rank 0 used to wait for ever
    for rank 1 in the control group's set-up at its first step)."""
    listen = f"127.0.0.1:{local_port()}"
    log = tmp_path / "attach.jsonl"
    attach = subprocess.Popen([sys.executable, "-m", "ddptui", "attach", "--headless", "--listen",
                               listen, "--log", str(log)], env=keyed_env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        script = os.path.join(ROOT, "tests", "helpers", "scripts", "half_linked.py")
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", "2", script, listen], env=keyed_env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "rank 0 finished" in r.stdout and "rank 1 finished" in r.stdout
        attach.communicate(timeout=30)
    finally:
        attach.kill()
    said = [e for e in events(log, "message") if e["rank"] == 0]
    assert "not every rank reports to the dashboard: live control is off" in \
        [e["text"] for e in said]
    assert {e["rank"] for e in events(log, "step")} == {0}


@pytest.mark.timeout(120)
def test_wrong_key_and_bad_messages_are_refused_and_the_dashboard_goes_on(tmp_path):
    port = local_port()
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(tmp_path / "a.jsonl"), "test")
    attach.start()
    try:
        with pytest.raises(AuthenticationError):
            Client(("127.0.0.1", port), authkey=b"not-the-key")
        deadline = time.monotonic() + 10
        while not any("wrong key" in line[3] for line in attach.state.lines_after(0)):
            assert time.monotonic() < deadline, "the refusal was not logged"
            time.sleep(0.05)
        good = Client(("127.0.0.1", port), authkey=REPORT_KEY.encode())
        good.send_bytes(b"\xff\xfe not json")
        good.send_bytes(b'{"kind": "step", "rank": "zero"}')  # wrong types
        good.send_bytes(b'{"t": 1, "kind": "rank", "rank": 3, "state": "running", "pid": 7}')
        deadline = time.monotonic() + 10
        while 3 not in {r.rank for r in attach.state.view().ranks}:
            assert time.monotonic() < deadline, "a valid event after bad ones was not applied"
            time.sleep(0.05)
        big = Client(("127.0.0.1", port), authkey=REPORT_KEY.encode())
        big.send_bytes(b"x" * (MAX_MESSAGE + 1))
        deadline = time.monotonic() + 10
        while not any("size limit" in line[3] for line in attach.state.lines_after(0)):
            assert time.monotonic() < deadline, "the oversized message was not dropped"
            time.sleep(0.05)
        good.send_bytes(b'{"t": 2, "kind": "rank", "rank": 4, "state": "running", "pid": 8}')
        deadline = time.monotonic() + 10
        while 4 not in {r.rank for r in attach.state.view().ranks}:
            assert time.monotonic() < deadline, "the dashboard stopped taking events"
            time.sleep(0.05)
    finally:
        attach.stop()


def test_a_rank_whose_dashboard_is_absent_or_has_another_key_says_so_once_and_goes_on(tmp_path):
    """A wrapped rank or ddptui.init() reporting to DDPTUI_REPORT: nobody listening yet, or a
    dashboard with another key, is one line each (not one a retry); the events wait for an
    attach that comes later."""
    from ddptui.rank.telemetry.remote import RETRY_S, RemoteLink

    port = local_port()
    said: list[str] = []
    link = RemoteLink(("127.0.0.1", port), REPORT_KEY.encode(), "vm/0", said.append)
    link.put(logged("rank", 0, state="running", pid=7))
    deadline = time.monotonic() + 10
    while not said:
        assert time.monotonic() < deadline, "an absent dashboard was not said"
        time.sleep(0.05)
    assert said == [f"no dashboard at 127.0.0.1:{port} yet: training goes on, and its latest "
                    f"10,000 events wait for `ddptui attach --listen 127.0.0.1:{port}`"]
    time.sleep(2.5 * RETRY_S)  # it retried meanwhile, silently
    assert len(said) == 1
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(tmp_path / "a.jsonl"), "test")
    attach.start()
    wrong: list[str] = []
    other = RemoteLink(("127.0.0.1", port), b"another key", "vm/1", wrong.append)
    try:
        deadline = time.monotonic() + 20
        while 0 not in {r.rank for r in attach.state.view().ranks} or not wrong:
            assert time.monotonic() < deadline, (said, wrong)
            time.sleep(0.05)
        assert wrong == [f"the dashboard at 127.0.0.1:{port} refused our key: check "
                         "DDPTUI_AUTHKEY or the key file"]
    finally:
        link.close()
        other.close(timeout=0)
        attach.stop()


@pytest.mark.timeout(240)
def test_killing_attach_mid_run_does_not_fail_training(keyed_env, tmp_path):
    listen = f"127.0.0.1:{local_port()}"
    alog, rlog = tmp_path / "attach.jsonl", tmp_path / "ranks.jsonl"
    attach = subprocess.Popen([sys.executable, "-m", "ddptui", "attach", "--headless", "--listen",
                               listen, "--log", str(alog)], env=keyed_env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    job = _torchrun(0, 1, local_port(), [*TINY, "--epochs", "12", "--report", listen,
                                    "--log", str(rlog)], keyed_env, tmp_path, nproc=2)
    wait_for_event(alog, lambda e: e["kind"] == "step", timeout=120)
    attach.send_signal(signal.SIGKILL)
    attach.wait()
    killed = time.time()
    out, err = job.communicate(timeout=180)
    assert job.returncode == 0, err[-2000:]
    assert {e["epoch"] for e in events(rlog, "epoch")} == set(range(12))
    assert events(rlog, "epoch")[-1]["t"] > killed  # it trained on after attach was gone
    assert_gone({attach.pid})


@pytest.mark.timeout(180)
def test_slurm_variables_start_a_two_rank_run(env, tmp_path):
    port = local_port()
    procs = []
    for rank in (0, 1):
        e = dict(env, SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                 SLURM_NODEID="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ddptui_trainer", *TINY, "--epochs", "2",
             "--log", str(tmp_path / "slurm.jsonl")], env=e, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=150)
        assert p.returncode == 0, err[-2000:]
    evs = events(tmp_path / "slurm.jsonl")
    assert "process group ready: 2 ranks on gloo" in [e.get("text") for e in evs]
    assert {(e["rank"], e["epoch"]) for e in evs if e["kind"] == "epoch"} == {
        (0, 0), (0, 1), (1, 0), (1, 1)}
    assert os.path.exists(tmp_path / "slurm.jsonl")


async def test_attach_dashboard_relays_commands_to_rank_0_and_delegates_stop(tmp_path):
    from ddptui.contract.channel import receive, send
    from ddptui.dashboard.view.app import DashboardApp

    port = local_port()
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(tmp_path / "a.jsonl"), "test")
    app = DashboardApp(attach)
    async with app.run_test(size=(120, 40)) as pilot:
        rank0 = Client(("127.0.0.1", port), authkey=REPORT_KEY.encode())
        for kind, fields in (("run", {"status": "started", "model": "resnet18", "epochs": 2,
                                      "world_size": 2, "device_kind": "cpu"}),
                             ("rank", {"state": "running", "pid": 11, "node": "a/0"}),
                             ("step", {"epoch": 0, "step": 1, "global_step": 1, "loss": 2.0,
                                       "samples_per_s": 100.0, "node": "a/0"})):
            send(rank0, {"t": time.time(), "kind": kind, "rank": 0, **fields})
        deadline = time.monotonic() + 10
        while not (app.view and app.view.ranks and app.view.status == "running"):
            assert time.monotonic() < deadline, "rank 0 never showed"
            await pilot.pause(0.1)
        await pilot.press("space", "space")  # faster than rank 0 answers: pause, then resume
        assert rank0.poll(5) and isinstance(receive(rank0), Pause)
        assert rank0.poll(5) and isinstance(receive(rank0), Resume)
        await pilot.press("W", "W")
        first, second = (receive(rank0) if rank0.poll(5) else None for _ in range(2))
        assert (first.settings, second.settings) == ({"workers": 1}, {"workers": 2})
        # Rank 0 echoes the first request late: the second stays pending, and W builds on it.
        send(rank0, {"t": time.time(), "kind": "settings", "rank": 0, "status": "pending",
                     "request": first.request, "settings": {"workers": 1}, "epoch": 1})
        await pilot.pause(0.5)
        await pilot.press("W")
        assert rank0.poll(5) and receive(rank0).settings == {"workers": 3}
        await pilot.press("s")
        await pilot.pause(0.5)
        assert any("belongs to its launcher" in line.text for line in app.events.lines)
        await pilot.press("q")
        await pilot.pause()
    assert attach.done.is_set()
    rank0.close()


@pytest.mark.timeout(120)
def test_a_script_with_the_three_lines_reports_to_attach_under_torchrun(keyed_env, tmp_path):
    """examples/with_ddptui.py under plain torchrun with DDPTUI_REPORT: attach sees each rank's
    own loss and samples, and the epochs; the script's output is its own, as without ddptui."""
    listen = f"127.0.0.1:{local_port()}"
    log = tmp_path / "attach.jsonl"
    attach = subprocess.Popen([sys.executable, "-m", "ddptui", "attach", "--headless", "--listen",
                               listen, "--log", str(log)], env=keyed_env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    env = dict(keyed_env, DDPTUI_REPORT=listen, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "examples"), keyed_env["PYTHONPATH"]]))
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", os.path.join(ROOT, "examples", "with_ddptui.py"),
                          "--epochs", "2", "--samples", "2048", "--image-size", "16", "--step-seconds",
                          "0.02"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert job.returncode == 0, job.stderr[-2000:]
    out, err = attach.communicate(timeout=30)
    assert attach.returncode == 0, err
    evs = events(log)
    steps = [e for e in evs if e["kind"] == "step"]
    assert {e["rank"] for e in steps} == {0, 1} and all(e["samples_per_s"] > 0 for e in steps)
    assert {(e["rank"], e["epoch"]) for e in evs if e["kind"] == "epoch"} == \
        {(r, ep) for r in (0, 1) for ep in (0, 1)}
    assert [e["status"] for e in evs if e["kind"] == "run"] == ["started", "done"]
    assert any(e["kind"] == "gpu" for e in evs)  # each rank samples its own device there


def test_the_ranks_table_groups_ranks_by_node():
    """srun's cyclic distribution puts ranks 0 and 2 on one node, 1 and 3 on the other; node 10
    comes after node 2."""
    from ddptui.contract.state.runstate import RunState

    state = RunState()
    for rank, node in ((0, "gpu/2"), (1, "gpu/10"), (2, "gpu/2"), (3, "gpu/10")):
        state.apply(logged("rank", rank, state="running", node=node))
    assert [(r.host, r.rank) for r in state.view().ranks] == \
        [("gpu/2", 0), ("gpu/2", 2), ("gpu/10", 1), ("gpu/10", 3)]


def test_closing_the_listener_ends_every_connection_once(monkeypatch):
    """attach's q (or a restart) closes its listener while ranks are connected: each rank sees
    the dashboard go at once, and no connection is closed twice. Before, close() closed each
    connection under its reader blocked in recv(), which Linux does not wake: the ranks saw
    nothing, and the reader closed the descriptor a second time when the next message came."""
    import threading

    from ddptui.contract.channel import connect, receive, send
    from ddptui.contract.listener import ReportListener

    failed: list = []
    monkeypatch.setattr(threading, "excepthook", failed.append)
    for _ in range(10):
        got, ended = [], threading.Event()
        listener = ReportListener(("127.0.0.1", 0), REPORT_KEY.encode(), got.append,
                                  lambda level, text: None)
        listener.start()
        ranks = [connect(listener.address, REPORT_KEY.encode()) for _ in range(4)]
        for rank, conn in enumerate(ranks):
            send(conn, logged("rank", rank, state="running", pid=rank))
        deadline = time.monotonic() + 10
        while len(listener.connected()) < 4:
            assert time.monotonic() < deadline, listener.connected()
            time.sleep(0.01)
        listener.closed = ended.set
        listener.close()
        for conn in ranks:
            assert conn.poll(10), "a rank did not see the dashboard go"
            with pytest.raises(EOFError):
                receive(conn)
            conn.close()
        deadline = time.monotonic() + 10
        while not listener.idle():
            assert time.monotonic() < deadline, "a reader did not end"
            time.sleep(0.01)
    assert failed == []


@pytest.mark.timeout(120)
def test_ranks_that_connect_in_the_same_instant_all_get_in():
    """A job's ranks connect at once after their rendezvous: with the listen queue's default of
    one, 12 of 32 never appeared (SYN cookies: the client connected, the listener had dropped
    it). 256 ranks connecting together each report, and each is connected."""
    import threading

    from ddptui.contract.channel import connect, send
    from ddptui.contract.listener import ReportListener

    got: list = []
    listener = ReportListener(("127.0.0.1", 0), REPORT_KEY.encode(), got.append,
                              lambda level, text: None)
    listener.start()
    go, conns = threading.Barrier(256), {}

    def rank(r: int) -> None:
        go.wait()
        conns[r] = connect(listener.address, REPORT_KEY.encode())
        send(conns[r], logged("rank", r, state="running", pid=1000 + r))

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(256)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(listener.connected()) < 256 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(listener.connected()) == list(range(256))
    listener.close()
    for conn in conns.values():
        conn.close()
