"""Under a real srun (a one-host SLURM: tests/helpers/slurm.py), an unmodified script through
`python -m ddptui.rank.wrap`, watched by attach: its ranks and node, a hung rank's stall and stacks,
`k`, scancel and `K`, each rank's end told with who ended it, and the job's end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ddptui.dashboard.sources.attach import Attach
from tests.helpers.runs import REPORT_KEY, ROOT, assert_gone, events, local_port, wait_for_event

PLAIN = os.path.join(ROOT, "examples", "plain_ddp.py")
HUNG = [PLAIN, "--epochs", "50", "--samples", "256", "--image-size", "16", "--hang-at-epoch", "1"]


def _step(slurm, env: dict, listen: str, cwd) -> subprocess.Popen:
    """srun -n 2 of the hung script, its ranks reporting to `listen`."""
    return subprocess.Popen(
        ["srun", "-n", "2", sys.executable, "-m", "ddptui.rank.wrap", *HUNG],
        env=dict(slurm.env, **{k: v for k, v in env.items() if k != "SLURM_CONF"},
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(local_port()), DDPTUI_REPORT=listen,
                 OMP_NUM_THREADS="1"),
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ends(log, since: int) -> dict[int, dict]:
    return {e["rank"]: e for e in events(log)[since:]
            if e["kind"] == "rank" and e["state"] in ("crashed", "done")}


def _attach(tmp_path, name: str) -> tuple[Attach, str, str]:
    port = local_port()
    log = str(tmp_path / f"{name}.jsonl")
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), log, "test", stall_after=2.0)
    attach.start()
    return attach, log, f"127.0.0.1:{port}"


@pytest.mark.timeout(300)
def test_srun_ranks_are_watched_and_k_scancel_and_K_ends_are_told(slurm, env, tmp_path):
    env = dict(env, DDPTUI_AUTHKEY=REPORT_KEY)
    steps, attaches, pids = [], [], set()
    try:
        # k on the hung rank: its sidecar kills it; srun's step ends as rank 0 fails on it.
        attach, log, listen = _attach(tmp_path, "k")
        attaches.append(attach)
        steps.append(_step(slurm, env, listen, tmp_path))
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 1 and e.get("stacks"), 90)
        assert "misbehave" in stacks["stacks"]
        running = {e["rank"]: e for e in events(log, "rank") if e.get("api") == "ddptui.rank.wrap"}
        assert running.keys() == {0, 1}
        assert {e["local_rank"] for e in running.values()} == {0, 1}  # SLURM_LOCALID
        pids |= {e["pid"] for e in running.values()}
        assert wait_for_event(log, lambda e: e["kind"] == "rank" and e["rank"] == 0
                              and e["state"] == "waiting", 30)["waiting_for"] == [1]
        since = len(events(log))
        attach.kill_rank(1)
        steps[0].communicate(timeout=60)
        assert steps[0].returncode != 0
        assert attach.done.wait(30) and attach.exit_code == 1  # the job's end, once both ended
        ends = _ends(log, since)
        assert ends[1]["reason"] == "killed by SIGKILL (k)"
        assert ends[0]["state"] == "crashed" and ends[0].get("reason")
        assert not [e for e in events(log)[since:] if e.get("state") == "unreachable"]
        assert events(log, "run")[-1]["reason"].startswith("rank 1: killed by SIGKILL (k)")

        # scancel, then K: each rank's end as SLURM or K brought it, told by its sidecar,
        # which is signalled too (SLURM signals every process of the step).
        def hung(name: str) -> tuple[Attach, str]:
            attach, log, listen = _attach(tmp_path, name)
            attaches.append(attach)
            steps.append(_step(slurm, env, listen, tmp_path))
            wait_for_event(log, lambda e: e["kind"] == "rank" and e["rank"] == 1
                           and e.get("state") == "stalled", 90)
            pids.update(e["pid"] for e in events(log, "rank") if e.get("api") == "ddptui.rank.wrap")
            return attach, log

        def ended(attach: Attach, log: str, said: str) -> None:
            steps[-1].communicate(timeout=60)
            assert attach.done.wait(30)
            ends = _ends(log, 0)
            assert ends.keys() == {0, 1} and all(said in e["reason"] for e in ends.values()), ends

        attach, log = hung("scancel")
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm.env, capture_output=True,
                              text=True).stdout.split()
        assert len(jobs) == 1
        subprocess.run(["scancel", jobs[0]], env=slurm.env, check=True)
        ended(attach, log, "launcher")
        attach, log = hung("K")
        attach.end_job()
        ended(attach, log, "(K)")
    finally:
        for step in steps:
            if step.poll() is None:
                step.send_signal(signal.SIGKILL)
                step.communicate(timeout=30)
        for attach in attaches:
            attach.stop()
    assert_gone(pids)
