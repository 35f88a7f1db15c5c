"""`python -m ddptui.wrap` between torchrun (or srun) and an unmodified script: the script runs
as without it, and `ddptui attach` gets each rank with its node, its loss lines, its process,
its stacks on request, its exception, and a stall or unreachable verdict."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ddptui.dashboard.sources.attach import Attach
from tests.helpers.monitoring import get, until
from tests.helpers.runs import REPORT_KEY, ROOT, assert_gone, events, local_port, wait_for_event
from tests.helpers.screens import rank_row

PLAIN = os.path.join(ROOT, "examples", "plain_ddp.py")
SPAWNS = os.path.join(ROOT, "tests", "helpers", "scripts", "spawns.py")
SMALL = ["--epochs", "2", "--samples", "256", "--image-size", "16"]


def _attach(listen: str, log, env, *more: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddptui", "attach", "--headless", "--listen",
                             listen, "--log", str(log), *more], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _node(node_rank: int, rdzv: int, env: dict, cwd) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
         str(node_rank), "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         f"127.0.0.1:{rdzv}", "--rdzv-id", "wrap-test", "-m", "ddptui.wrap", PLAIN, *SMALL],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(180)
def test_two_torchrun_nodes_of_an_unmodified_script_report_through_the_wrapper(keyed_env,
                                                                              tmp_path):
    listen, metrics = f"127.0.0.1:{local_port()}", local_port()
    log = tmp_path / "attach.jsonl"
    attach = _attach(listen, log, keyed_env, "--metrics", str(metrics))
    env = dict(keyed_env, DDPTUI_REPORT=listen)
    rdzv = local_port()
    nodes = [_node(n, rdzv, env, tmp_path) for n in (0, 1)]
    # attach's Prometheus endpoint while the job runs: a series a rank, each with its node.
    scraped = until(lambda: (text := get(f"http://127.0.0.1:{metrics}/metrics")[1]).count(
        'ddptui_rank_state{local_rank="0"') >= 2 * 11 and text, 120)
    outs = []
    for node in nodes:
        out, err = node.communicate(timeout=150)
        assert node.returncode == 0, err[-2000:]
        outs.append(out)
    assert "rank 0 epoch 1 step 0 loss:" in outs[0]  # its own output, passed through
    out, err = attach.communicate(timeout=30)
    assert attach.returncode == 0, err
    evs = events(log)
    ranks = {e["rank"]: e for e in evs if e["kind"] == "rank" and e.get("api") == "ddptui.rank.wrap"}
    assert set(ranks) == {0, 1} and ranks[0]["node"] != ranks[1]["node"]
    assert all(ranks[r]["local_rank"] == 0 for r in (0, 1))  # one rank a node
    for r in (0, 1):
        assert f'ddptui_rank_state{{local_rank="0",node="{ranks[r]["node"]}",rank="{r}"' in scraped
    steps = [e for e in evs if e["kind"] == "step"]
    assert {e["rank"] for e in steps} == {0, 1}
    assert all(e["source"] == "output" and e["loss"] > 0 for e in steps)
    assert {(e["rank"], e["epoch"]) for e in evs if e["kind"] == "epoch"} == \
        {(r, ep) for r in (0, 1) for ep in (0, 1)}
    assert {e["rank"] for e in evs if e["kind"] == "process"} == {0, 1}
    assert [e["status"] for e in evs if e["kind"] == "run"] == ["started", "done"]
    # Each rank's whole output, kept beside attach's log as ddptui run keeps it.
    for rank in (0, 1):
        kept = (tmp_path / f"attach.rank{rank}.out").read_text().splitlines()
        printed = outs[rank].splitlines()  # its stdout, as its node printed it
        assert f"rank {rank} epoch 1 step 0 loss:" in outs[rank]
        assert [line for line in kept if line in printed] == printed
    assert_gone({e["pid"] for e in evs if e["kind"] == "rank" and e.get("pid")})


@pytest.mark.timeout(180)
def test_a_launcher_under_the_wrapper_reports_each_rank_it_spawns_on_every_node(keyed_env,
                                                                            tmp_path):
    """HRNet's form of a multi-node job: each node runs `python -m ddptui.wrap train.py
    --dist-url tcp://NODE0:PORT`, whose mp.spawn starts that node's ranks. attach gets every
    spawned rank of every node, each with its own pid, loss and end, and not the launchers
    (each was one rank 0 before, its workers' output merged in it)."""
    listen = f"127.0.0.1:{local_port()}"
    log = tmp_path / "attach.jsonl"
    attach = _attach(listen, log, keyed_env)
    port = str(local_port())
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "ddptui.wrap", SPAWNS, "--nprocs", "1", "--nodes", "2",
         "--node-rank", str(n), "--port", port],
        env=dict(keyed_env, DDPTUI_REPORT=listen, GROUP_RANK=str(n)), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    for node in nodes:
        _, err = node.communicate(timeout=150)
        assert node.returncode == 0, err[-2000:]
        assert "spawns.py starts its own ranks (torch.multiprocessing.spawn" in err
    out, err = attach.communicate(timeout=30)
    assert attach.returncode == 0, err
    evs = events(log)
    ranks = {e["rank"]: e for e in evs if e["kind"] == "rank" and e.get("api") == "ddptui.rank.wrap"}
    assert set(ranks) == {0, 1} and ranks[0]["node"] != ranks[1]["node"]
    assert not {ranks[r]["pid"] for r in (0, 1)} & {node.pid for node in nodes}
    assert {e["rank"] for e in evs if e["kind"] == "step"} == {0, 1}
    ends = {e["rank"]: e["state"] for e in evs if e["kind"] == "rank" and e.get("exit_code") == 0}
    assert ends == {0: "done", 1: "done"}
    assert [e["status"] for e in evs if e["kind"] == "run"] == ["started", "done"]
    assert_gone({e["pid"] for e in evs if e["kind"] == "rank" and e.get("pid")})


@pytest.mark.timeout(120)
def test_a_hung_wrapped_rank_is_flagged_k_kills_it_each_end_is_told_and_a_silent_one_unreachable(
        keyed_env, tmp_path):
    port = local_port()
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(tmp_path / "a.jsonl"), "test",
                    stall_after=2.0)
    attach.start()
    log, scratch = tmp_path / "a.jsonl", tmp_path / "tmp"
    scratch.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "ddptui.wrap", PLAIN, *SMALL, "--epochs", "50", "--hang-at-epoch", "1"],
        env=dict(keyed_env, DDPTUI_REPORT=f"127.0.0.1:{port}", TMPDIR=str(scratch)), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 1 and e.get("stacks"), 60)
        assert "misbehave" in stacks["stacks"]  # rank 1 sleeps in the script's own function
        assert stacks["text"].startswith("is in misbehave (plain_ddp.py:")  # "rank 1: is in..."
        flagged = [e for e in events(log, "rank") if e["rank"] == 1 and e["state"] == "stalled"]
        assert flagged and flagged[0]["cause"] in ("idle", "silent")
        waiting = wait_for_event(log, lambda e: e["kind"] == "rank" and e["rank"] == 0
                                 and e["state"] == "waiting", 30)
        assert waiting["waiting_for"] == [1]
        pids = {e["rank"]: e["pid"] for e in events(log, "rank") if e.get("api")}
        # Its sidecar watches from outside: a stopped rank is still reported, as stopped...
        os.kill(pids[0], signal.SIGSTOP)
        wait_for_event(log, lambda e: e["kind"] == "process" and e["rank"] == 0
                       and e["status"] == "stopped", 30)
        # ... and one that nothing is heard from at all (a dead node, a cut link) unreachable.
        sidecar = next(c for c in psutil.Process(pids[0]).children()
                       if "ddptui.rank.wrap.sidecar" in " ".join(c.cmdline()))
        sidecar.suspend()
        gone = wait_for_event(log, lambda e: e["kind"] == "rank" and e["rank"] == 0
                              and e["state"] == "unreachable", 30)
        assert "no report" in gone["reason"]
        sidecar.resume()
        os.kill(pids[0], signal.SIGCONT)
        killed_at = len(events(log))
        attach.kill_rank(1)  # k: through its wrapper; torchrun then ends the job
        job.communicate(timeout=60)
        assert job.returncode != 0
        assert any("kills itself through its wrapper" in e["text"]
                   for e in events(log, "message"))
        # Each rank's end, told by itself or by its sidecar, which outlives it: who ended it,
        # never "unreachable" (torchrun's SIGTERM to a rank's process group reaches its sidecar).
        wait_for_event(log, lambda e: e["kind"] == "rank" and e["rank"] == 0
                       and e["state"] == "crashed", 30)
        after = [e for e in events(log)[killed_at:] if e["kind"] == "rank"]
        ends = {e["rank"]: e for e in after if e["state"] in ("crashed", "done")}
        assert ends[1]["reason"] == "killed by SIGKILL (k)" and ends[1]["exit_code"] == -9
        # rank 0's own cause: gloo's broken connection, or torchrun's SIGTERM where that came first
        assert ends[0]["reason"].startswith(("RuntimeError", "killed by SIGTERM from its launcher"))
        assert not [e for e in after if e["state"] == "unreachable"]
        # ... and the job's end, once every rank ended: attach is done, exit 1.
        assert attach.done.wait(30) and attach.exit_code == 1
        end = events(log, "run")[-1]
        assert end["status"] == "failed" and end["reason"].startswith(
            "rank 1: killed by SIGKILL (k) (the first of 2 ranks that failed)")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
            job.communicate(timeout=60)
        attach.stop()
    assert_gone(set(pids.values()))
    # Each wrapper's folder of stacks and dumps went with it, though rank 1 was killed outright.
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("ddptui-")]


BUSY = """
import time
for i in range(4):
    print(f"step {i} loss: {1 / (i + 1):.3f}", flush=True)
    time.sleep(0.2)
sum(range(10**13))  # C code holding the GIL: no Python thread of this process runs
"""


@pytest.mark.timeout(90)
def test_a_rank_stuck_holding_the_gil_is_stalled_with_its_stacks_not_unreachable(keyed_env,
                                                                                 tmp_path):
    """Its sidecar reports from outside: the process is alive and busy (CPU), and its stacks
    come from faulthandler in C. In-process threads would all have stopped."""
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    port = local_port()
    log = tmp_path / "a.jsonl"
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(log), "test", stall_after=2.0)
    attach.start()
    rank = subprocess.Popen([sys.executable, "-m", "ddptui.wrap", str(script)],
                            env=dict(keyed_env, DDPTUI_REPORT=f"127.0.0.1:{port}"), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_event(log, lambda e: e["kind"] == "rank" and e["state"] == "stalled", 60)
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 0 and e.get("stacks"), 30)
        assert "busy.py" in stacks["stacks"]
        pids = {rank.pid} | {c.pid for c in psutil.Process(rank.pid).children()}
    finally:
        rank.kill()
        rank.communicate(timeout=30)
        attach.stop()
    assert not [e for e in events(log, "rank") if e["state"] == "unreachable"]
    assert_gone(pids)


@pytest.mark.timeout(120)
def test_under_srun_the_wrapper_gives_torchruns_variables_and_a_failing_rank_its_exception(
        keyed_env, tmp_path):
    """srun's environment (no SLURM here: the variables it sets): the script's env:// init
    works, and rank 1's exception is its reason in attach."""
    listen = f"127.0.0.1:{local_port()}"
    log = tmp_path / "attach.jsonl"
    attach = _attach(listen, log, keyed_env)
    master = local_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "ddptui.wrap", PLAIN, *SMALL, "--fail-at-epoch", "1"],
        env=dict(keyed_env, SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                 SLURM_NODEID="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master),
                 DDPTUI_REPORT=listen), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        error = wait_for_event(log, lambda e: e["kind"] == "error" and e["rank"] == 1, 90)
        assert error["text"] == "RuntimeError: rank 1 gave up at epoch 1"
        assert any("misbehave" in line for line in error["traceback"])
        _, err = procs[1].communicate(timeout=60)
        assert procs[1].returncode == 1 and "RuntimeError: rank 1 gave up" in err
        # The traceback as it prints without the wrapper (torch.distributed's excepthook puts
        # [rank1]: before each line): from the script's own frame.
        shown = err[err.index("Traceback (most recent call last):"):].splitlines()
        assert shown[1].removeprefix("[rank1]: ").startswith(f'  File "{PLAIN}", line ')
        assert "runpy" not in err and "ddptui/rank/wrap/" not in err
        steps = {e["rank"] for e in events(log, "step")}
        assert steps == {0, 1}  # both trained epoch 0: RANK and WORLD_SIZE came from SLURM_*
    finally:
        for p in procs:
            p.kill()
            p.wait()
        attach.kill()
        attach.wait()
        time.sleep(0)


@pytest.mark.timeout(120)
def test_an_attach_restarted_mid_run_picks_every_wrapped_rank_up_again(keyed_env, tmp_path):
    port = local_port()
    first = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(tmp_path / "1.jsonl"), "test")
    first.start()
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "ddptui.wrap", PLAIN, *SMALL, "--epochs", "400"],
        env=dict(keyed_env, DDPTUI_REPORT=f"127.0.0.1:{port}"), cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for rank in (0, 1):
            wait_for_event(tmp_path / "1.jsonl", lambda e, r=rank: e["kind"] == "step"
                           and e["rank"] == r, 60)
        first.stop()  # detach: training goes on
        second = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(tmp_path / "2.jsonl"), "test",
                        stall_after=30.0)
        second.start()
        try:
            for rank in (0, 1):  # each rank's next report, its step figures included
                wait_for_event(tmp_path / "2.jsonl", lambda e, r=rank: e["kind"] == "process"
                               and e["rank"] == r, 60)
                wait_for_event(tmp_path / "2.jsonl", lambda e, r=rank: e["kind"] == "step"
                               and e["rank"] == r, 60)
            second.stacks(1)  # known as wrapped from its figures alone: it can be asked
            stacks = wait_for_event(tmp_path / "2.jsonl", lambda e: e.get("stacks_of") == 1, 30)
            assert "plain_ddp.py" in stacks["stacks"]
        finally:
            second.stop()
        assert job.poll() is None  # the job never noticed
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.communicate(timeout=60)


@pytest.mark.parametrize("argv, said", [
    (["nosuch.py"], "ddptui.wrap: no such script: nosuch.py"),
    (["-m", "nosuch_module"], "ddptui.wrap: module not found: nosuch_module"),
    (["-m", "nosuch_package.train"], "ddptui.wrap: module not found: nosuch_package.train"),
    (["-m", "tests.helpers"], "ddptui.wrap: tests.helpers is a package with no __main__ module "
                              "to run"),
    ([], "usage: python -m ddptui.wrap SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"),
])
def test_a_script_or_module_that_cannot_start_is_one_line_and_exit_2(argv, said, capsys,
                                                                     monkeypatch):
    from ddptui.rank.wrap.runner import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the wrapper sets the script's argv
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [said]


DEAF = """
import signal, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
print("loss: 1.0", flush=True)
if dist.get_rank() == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to its launcher's SIGTERM, and K's
    time.sleep(3600)
dist.all_reduce(torch.zeros(1))  # rank 0 waits here for ever
"""


@pytest.mark.timeout(120)
async def test_K_ends_a_hung_job_sigterm_then_sigkill_after_the_grace(keyed_env, tmp_path):
    """K, asked first, in attach's dashboard: each wrapped rank's sidecar sends SIGTERM, and
    SIGKILL after --grace to a rank still there; each end says so, the job's end follows, and
    no process of the job is left."""
    from ddptui.dashboard.view.app import DashboardApp
    from ddptui.dashboard.view.screens.confirm import ConfirmEndJob

    script, log, port = tmp_path / "deaf.py", tmp_path / "a.jsonl", local_port()
    script.write_text(DEAF)
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(log), "test", grace=2.0)
    app = DashboardApp(attach)
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "ddptui.wrap", str(script)],
        env=dict(keyed_env, DDPTUI_REPORT=f"127.0.0.1:{port}"), cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            for _ in range(600):  # both ranks printed their line: rank 1 is deaf by then
                if {e["rank"] for e in events(log) if "loss: 1.0" in
                        (e.get("text") or "") + "".join(e.get("lines") or [])} == {0, 1}:
                    break
                await pilot.pause(0.1)
            pids = {e["rank"]: e["pid"] for e in events(log, "rank") if e.get("api")}
            await pilot.press("K")
            assert isinstance(app.screen, ConfirmEndJob)
            await pilot.press("y")
            job.communicate(timeout=60)
            for _ in range(300):
                if attach.done.is_set() and rank_row(app, 1).get("process") == "ended":
                    break
                await pilot.pause(0.1)
            # Ended ranks show no last readings as if live.
            assert [rank_row(app, r)["process"] for r in (0, 1)] == ["ended", "ended"]
            assert [rank_row(app, r)["CPU"] for r in (0, 1)] == ["-", "-"]
            await pilot.press("q")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=60)
        attach.stop()
    assert job.returncode != 0
    said = [e["text"] for e in events(log, "message")]
    assert any(t.startswith("K: ending the job: SIGTERM to 2 ranks (0, 1)") for t in said)
    ends = {e["rank"]: e["reason"] for e in events(log, "rank") if e["state"] == "crashed"}
    # Rank 0 dies of the SIGTERM; torchrun's agent may reap it before its sidecar reads how.
    assert ends[0] in ("killed by SIGTERM (K)",
                       "ended on SIGTERM (K); its launcher took its exit status first")
    assert ends == {0: ends[0], 1: "killed by SIGKILL (K, still there 2 s after its SIGTERM)"}
    assert attach.exit_code == 1 and events(log, "run")[-1]["status"] == "failed"
    assert_gone(set(pids.values()))


def test_the_sidecars_death_signal_handler_never_waits_for_a_lock():
    """The kernel's word that the rank died (PR_SET_PDEATHSIG, once per thread of the rank that
    ends) can come twice at once: a handler that set the `gone` Event itself waited for ever on
    the lock held by what it interrupted (found as a sidecar left behind, holding its job's
    stderr, in a loaded suite). The handler, run while that lock is held, returns."""
    import threading
    import types

    from ddptui.rank.wrap.sidecar import noted_gone

    sidecar = types.SimpleNamespace(signalled_gone=None, gone=threading.Event())
    with sidecar.gone._cond:  # as the main thread holds it inside Event.wait or set
        handler = threading.Thread(target=noted_gone(sidecar), args=(12, None), daemon=True)
        handler.start()
        handler.join(5)
        assert not handler.is_alive() and sidecar.signalled_gone is not None
