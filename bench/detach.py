"""A run in the background and its dashboards, on GPUs: `ddptui run MODEL --detach` (or a
script's), attach, k rank 1 and r (2 GPUs or more), leave, attach again, then end it with q's
order; prints the times and what is left.

    python bench/detach.py --gpus 0,1 [--script examples/plain_ddp.py --elastic]

Each dashboard here is the Viewer the dashboard uses (no screen): connect, read, send orders.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import psutil  # noqa: E402

from ddptui.contract.jsonl import read_records  # noqa: E402
from ddptui.dashboard.background import connect  # noqa: E402


def until(check, timeout: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise SystemExit(f"{what}: not within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - started


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="0,1")
    ap.add_argument("--cpus", type=int, default=None, help="CPU ranks instead (a dry run)")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--script", default=None, help="a script to run instead of the model")
    ap.add_argument("--script-args", default="", help="its arguments, one string")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    log = os.path.join(tmp, "bg.jsonl")
    env = dict(os.environ, XDG_RUNTIME_DIR=tmp)
    devices = ["--cpus", str(args.cpus)] if args.cpus else ["--gpus", args.gpus]
    fast = (["--image-size", "32", "--batch-size", "16", "--workers", "0"] if args.cpus else
            ["--amp", "bf16", "--channels-last"])
    what = (["run", *devices, "--log", log, "--detach", args.script, "--",
             *args.script_args.split()] if args.script else
            ["run", args.model, *devices, "--data", "synthetic", *fast, "--epochs", "20",
             "--steps-per-epoch", "400", "--log", log, "--detach"])
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ddptui", *what], env=env, capture_output=True,
                         text=True, check=True).stdout
    detach_s = time.monotonic() - t0
    pid = int(re.search(r"\(pid (\d+)\)", out)[1])
    sock = os.path.join(tmp, "ddptui", f"{pid}.sock")
    os.environ["XDG_RUNTIME_DIR"] = tmp
    first_step_s = until(lambda: any(e["kind"] == "step" for e in read_records(log)), 300,
                         "a first step")
    result = {"detach_returned_s": round(detach_s, 2), "first_step_after_s": round(first_step_s, 2)}

    started = time.monotonic()
    viewer = connect(sock)
    result["attach_state_s"] = round(time.monotonic() - started, 3)
    viewer.start()
    ranks = args.cpus or len(args.gpus.split(","))
    if ranks >= 2:
        def world(size: int):
            return lambda: any(e["kind"] == "world" and e.get("generation") and e["size"] == size
                               for e in read_records(log)[seen:])
        seen = len(read_records(log))
        killed = time.time()
        viewer.kill_rank(1)
        until(world(ranks - 1), 60, "a smaller world after k")
        formed = next(e["t"] for e in read_records(log)[seen:]
                      if e["kind"] == "world" and e.get("generation"))
        result["k_to_smaller_world_s"] = round(formed - killed, 2)
        seen = len(read_records(log))
        asked = time.time()
        viewer.restart_rank(1)
        until(world(ranks), 180, "the whole world again after r")
        formed = next(e["t"] for e in read_records(log)[seen:]
                      if e["kind"] == "world" and e.get("generation") and e["size"] == ranks)
        result["r_to_whole_world_s"] = round(formed - asked, 2)
    viewer.close()  # d: the run goes on
    step = max(e.get("global_step", 0) for e in read_records(log) if e["kind"] == "step")
    until(lambda: max(e.get("global_step", 0) for e in read_records(log)
                      if e["kind"] == "step") > step + 20, 60, "steps after d")
    result["ran_on_after_d"] = True

    started = time.monotonic()
    again = connect(sock)
    result["attach_again_state_s"] = round(time.monotonic() - started, 3)
    result["events_on_screen"] = len(again.state.lines_after(0))
    again.start()
    pids = {e["pid"] for e in read_records(log) if e.get("pid")} | {pid}
    started = time.monotonic()
    again.stop(code=130)  # q, y
    until(again.done.is_set, 120, "the run's end")
    result["q_to_end_s"] = round(time.monotonic() - started, 2)
    result["exit_code"] = again.exit_code
    until(lambda: not any(map(alive, pids)), 30, "every process gone")
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
            if any("ddptui" in part for part in p.info["cmdline"] or [])
            and p.pid != os.getpid()]
    result["processes_left"] = len(left)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
