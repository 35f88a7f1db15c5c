"""A hung rank under `python -m ddptui.wrap`, on two torchrun "nodes" of one GPU each on one
machine, as `ddptui attach` sees it: the stall verdicts, the stacks, each rank's NCCL flight
recorder and the cross-node blame it gives, then `k` through the wrapper, each rank's end as
attach tells it, a job that cannot go on, and `K`, the whole job's end.

python bench/wrap_hang.py --stall-after 10 --timeout 120 --out $OUT/wrap_hang.json
examples/plain_ddp.py unmodified (resnet18-sized steps are not needed: its small CNN), rank 1
sleeping in the script's own function from epoch 1 on (--hang-at-epoch 1) while rank 0 goes on
into the next collective. Times are from rank 1's last step event, by attach's clock.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from ddptui.contract.jsonl import read_records  # noqa: E402
from ddptui.dashboard.sources.attach import Attach  # noqa: E402
from ddptui.run.ports import free_port  # noqa: E402

SCRIPT = os.path.join(ROOT, "examples", "plain_ddp.py")


def events(log: str) -> list[dict]:
    return read_records(log) if os.path.exists(log) else []  # a half-written line is skipped


def wait_for(log: str, test, timeout: float) -> dict | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in events(log) if test(e)]
        if found:
            return found[0]
        time.sleep(0.2)
    return None


def nodes(env: dict, cwd: str, gpus: int) -> list[subprocess.Popen]:
    rdzv = free_port()
    return [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(n),
         "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
         f"127.0.0.1:{rdzv}", "--rdzv-id", f"hang-{rdzv}", "-m", "ddptui.wrap", SCRIPT,
         "--epochs", "50", "--samples", "4096", "--hang-at-epoch", "1"],
        env=dict(env, **({"CUDA_VISIBLE_DEVICES": str(n)} if gpus else {})), cwd=cwd,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for n in (0, 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stall-after", type=float, default=10.0)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPUs, to try it (no recorder)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for it all")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    key = secrets.token_hex(16)
    env = dict(os.environ, DDPTUI_AUTHKEY=key, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "attach.jsonl")
        port = free_port()
        attach = Attach(("127.0.0.1", port), key.encode(), log, "bench", args.stall_after)
        attach.start()
        jobs = nodes(dict(env, DDPTUI_REPORT=f"127.0.0.1:{port}"), tmp, 0 if args.cpu else 2)
        try:
            result = watch(attach, log, args.timeout, jobs)
        finally:
            errs = []
            for job in jobs:
                if job.poll() is None:
                    os.killpg(job.pid, signal.SIGTERM)
                errs.append(job.communicate(timeout=60)[1])
            attach.stop()
            if args.out:  # attach's log and each rank's output as it kept them, to read after
                os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
                for name in os.listdir(tmp):
                    if name.startswith("attach."):
                        shutil.copy(os.path.join(tmp, name), os.path.dirname(args.out) or ".")
    result["exit_codes"] = [job.returncode for job in jobs]
    if not result.get("waiting"):  # what each node said, to see how far the job got
        result["stderr_tails"] = [err.splitlines()[-15:] for err in errs]
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result.get("waiting") and not result["shown_running_after_flag"] else 1


def watch(attach: Attach, log: str, timeout: float, jobs: list[subprocess.Popen]) -> dict:
    """Everything attach said about the hang, timed from rank 1's last step; each verdict and
    message printed as it comes, so that a run cut short still says how far it got."""
    deadline, seen = time.monotonic() + timeout, 0
    waiting, flights = None, {}
    while time.monotonic() < deadline and not (waiting and len(flights) == 2):
        evs = events(log)
        for e in evs[seen:]:
            if e["kind"] in ("rank", "message", "error", "run"):
                print(json.dumps({k: e[k] for k in ("t", "kind", "rank", "state", "reason",
                                                    "text", "status") if k in e})[:400],
                      flush=True)
            if e["kind"] == "rank" and e["rank"] == 0 and e.get("state") == "waiting":
                waiting = waiting or e
            if e.get("flight"):
                flights[e["rank"]] = e["text"]
        seen = len(evs)
        time.sleep(0.5)
    evs = events(log)
    last_step = max((e["t"] for e in evs if e["kind"] == "step" and e["rank"] == 1), default=None)

    def after(e: dict | None) -> float | None:
        return None if e is None or last_step is None else round(e["t"] - last_step, 2)

    flags = {r: next((e for e in evs if e["kind"] == "rank" and e["rank"] == r
                      and e["state"] == "stalled"), None) for r in (0, 1)}
    stacks = {r: next((e for e in evs if e.get("stacks_of") == r and not e.get("flight")), None)
              for r in (0, 1)}
    pids = {e["pid"] for e in evs if e["kind"] == "rank" and e.get("pid")}
    t_k = time.time()
    attach.kill_rank(1)
    killed = wait_for(log, lambda e: e["kind"] == "message" and "kills itself" in e.get("text", ""),
                      10)
    ended = wait_for(log, lambda e: e["kind"] == "rank" and e["rank"] == 1
                     and e.get("state") == "crashed", 15)
    shown = time.time()  # its event is dated when the rank died
    stuck = wait_for(log, lambda e: "cannot go on" in e.get("text", "") or
                     e["kind"] == "rank" and e["rank"] == 0 and e.get("state") == "crashed", 30)
    t_big_k = time.time()
    attach.end_job()
    while time.time() - t_big_k < 60 and any(j.poll() is None for j in jobs):
        time.sleep(0.1)
    gone = time.time() - t_big_k
    ends = {e["rank"]: e.get("reason") for e in events(log) if e["kind"] == "rank"
            and e.get("state") in ("crashed", "done")}
    job_end = next((e for e in reversed(events(log)) if e["kind"] == "run"
                    and e.get("status") in ("done", "failed")), None)
    return {"k_to_end_shown_s": ended and round(shown - t_k, 2),
            "after_k": stuck and (stuck.get("text") or stuck.get("reason")),
            "after_k_s": stuck and round(stuck["t"] - t_k, 2),
            "K_to_no_process_s": round(gone, 2), "ends": ends,
            "job_end": job_end and job_end.get("reason"),
            "left": sorted(p for p in pids if psutil.pid_exists(p)),
            "stalled_s": {r: after(flags[r]) for r in (0, 1)},
            "stalled_reason": {r: flags[r] and flags[r]["reason"] for r in (0, 1)},
            "stacks_s": {r: after(stacks[r]) for r in (0, 1)},
            "flight": flights, "waiting_s": after(waiting),
            # a hung rank is never shown running again: 0 wanted
            "shown_running_after_flag": [e["reason"] for e in evs if e["kind"] == "rank"
                                         and e.get("state") == "running" and flags.get(e["rank"])
                                         and e["t"] > flags[e["rank"]]["t"]],
            "waiting": waiting and waiting["reason"], "k": killed and killed["text"]}



if __name__ == "__main__":
    sys.exit(main())
