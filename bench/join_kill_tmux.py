"""A member killed just after another joined, as a user drives it: the dashboard in tmux, `s` and
`r` on rank 1, then kill -9 of rank 2 `--after` seconds after the world of 3 formed (its event in
the log). Each run passes when the world goes to [0, 1] (the joiner kept), rank 2 alone crashed,
ranks 0 and 1 train on, q then y exits 130 and no process of it is left.

    python bench/join_kill_tmux.py [--runs 10] [--after 0.3] [-- ddptui run options]

Default run: resnet18 on 3 CPU ranks, 8 steps an epoch, 32x32 images, batch 16.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ["resnet18", "--cpus", "3", "--epochs", "200", "--steps-per-epoch", "8", "--image-size",
       "32", "--batch-size", "16"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--after", type=float, default=0.3, help="seconds after the world of 3")
    ap.add_argument("run", nargs="*", default=RUN, help="ddptui run's model and options")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ddptui-join-kill-")
    t0, passed = time.monotonic(), 0
    for i in range(args.runs):
        ok, said = one(os.path.join(work, f"run{i}.jsonl"), args.run, args.after)
        passed += ok
        print(f"run {i}: {said}: {'PASS' if ok else 'FAIL'}", flush=True)
    print(f"{passed} of {args.runs} passed in {time.monotonic() - t0:.0f} s")


def one(log: str, run: list[str], after: float) -> tuple[bool, str]:
    subprocess.run(["tmux", "kill-session", "-t", "joinkill"], capture_output=True)
    cmd = " ".join([sys.executable, "-m", "ddptui", "run", *run, "--log", log])
    subprocess.run(["tmux", "new-session", "-d", "-s", "joinkill", "-x", "160", "-y", "50",
                    f"cd {ROOT} && {cmd}; echo $? > {log}.exit"], check=True)
    worlds = lambda: [e for e in _events(log) if e["kind"] == "world" and e["rank"] >= 0]  # noqa: E731
    _until(lambda: {e["rank"] for e in _events(log) if e["kind"] == "step"} >= {0, 1, 2},
           "3 ranks training", 240)
    pids = _pids(log)
    _keys("Down")
    time.sleep(0.3)
    _keys("s")
    _until(lambda: any(w["ranks"] == [0, 2] for w in worlds()), "the world without rank 1")
    _until(lambda: any(e["kind"] == "rank" and e["rank"] == 1 and e.get("standby") == "ready"
                       for e in _events(log)), "rank 1's standby")
    _keys("r")
    formed = _until(lambda: [w for w in worlds() if w["size"] == 3], "the world of 3")[-1]
    time.sleep(max(0.0, formed["t"] + after - time.time()))
    victim = [e["pid"] for e in _events(log) if e["kind"] == "rank" and e["rank"] == 2
              and e.get("pid")][-1]
    os.kill(victim, signal.SIGKILL)
    then = _until(lambda: [w for w in worlds() if w["t"] > formed["t"]], "a world after")[0]
    time.sleep(8)
    crashed = [e["rank"] for e in _events(log) if e["kind"] == "rank"
               and e.get("state") == "crashed" and e.get("exit_code") is not None]
    training = {e["rank"] for e in _events(log) if e["kind"] == "step"
                and e["t"] > then["t"] + 3}
    pids |= _pids(log)
    _keys("q")
    time.sleep(0.5)
    _keys("y")
    _until(lambda: os.path.exists(f"{log}.exit"), "the dashboard's exit", 60)
    with open(f"{log}.exit") as f:
        code = f.read().strip()
    time.sleep(1)
    left = [p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    ok = then["ranks"] == [0, 1] and crashed == [2] and training == {0, 1} and code == "130" \
        and not left
    return ok, (f"world after the kill {then['ranks']} ({then['t'] - formed['t']:.2f} s after "
                f"the world of 3), crashed {crashed}, training after {sorted(training)}, "
                f"exit {code}, processes left {len(left)}")


def _events(log: str) -> list[dict]:
    try:
        with open(log) as f:
            return [json.loads(line) for line in f if line.strip().endswith("}")]
    except FileNotFoundError:
        return []


def _pids(log: str) -> set[int]:
    """Every process the log names (ranks, standbys, the run's own) and their children now."""
    pids = {e["pid"] for e in _events(log) if isinstance(e.get("pid"), int)}
    for pid in list(pids):
        try:
            pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            pass
    return pids


def _keys(*keys: str) -> None:
    subprocess.run(["tmux", "send-keys", "-t", "joinkill", *keys], check=True)


def _until(predicate, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.01)
    return found


if __name__ == "__main__":
    main()
