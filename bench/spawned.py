"""A script that starts its own ranks (bench/spawn_train.py: mp.spawn, NCCL) under `ddptui run`
against the same script run plainly (`python bench/spawn_train.py`), alternating, on every GPU.

python bench/spawned.py --rounds 3 [--tmux] --out results.json
Prints the img/s rank 0 measured per round and the ratio to the plain run (--tmux: ddptui with
its dashboard drawing in a 160x50 tmux window, the screen kept as $OUT/screen.txt); then one
run under ddptui whose rank 0 sleeps in its own code (--stall): what its log says of the ranks
(their pids, GPU memory) and of the stall (the stacks and the NCCL collective it is in).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading

from compare import in_tmux  # bench/compare.py: the dashboard in tmux, q once the run is done

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "spawn_train.py")


def one(ddptui: bool, script_args: list[str], env: dict, tmp: str, extra=(),
        tmux: bool = False) -> tuple[float, str]:
    log = os.path.join(tmp, f"run{len(os.listdir(tmp))}.jsonl")
    run = ["-m", "ddptui", "run", *([] if tmux else ["--headless"]), "--log", log, *extra]
    cmd = [sys.executable, *(run if ddptui else []), SCRIPT, *script_args]
    if tmux:  # the rank's stdout is on the dashboard and in its .out file
        threading.Timer(14.0, _screen, (f"bench{os.getpid()}",)).start()
        stuck = threading.Timer(150.0, _stuck, (log,))
        stuck.start()
        in_tmux(cmd, log, tmp)
        stuck.cancel()
        with open(log[:-len(".jsonl")] + ".rank0.out") as f:
            out = f.read()
    else:
        r = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{'ddptui' if ddptui else 'plain'} failed:\n{r.stderr[-3000:]}")
        out = r.stdout
    line = [ln for ln in out.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)["img_s"], log


def _stuck(log: str) -> None:
    """A run under the dashboard not done after 150 s: its events but steps, the processes and
    the screen, into $OUT/stuck.txt (where OUT is set)."""
    if not os.environ.get("OUT"):
        return
    with open(os.path.join(os.environ["OUT"], "stuck.txt"), "w") as f:
        f.writelines(line for line in open(log) if '"kind":"step"' not in line
                     and '"kind":"gpu"' not in line and '"kind":"process"' not in line)
        f.write(subprocess.run(["ps", "-eo", "pid,ppid,pgid,stat,wchan:30,args"],
                               capture_output=True, text=True).stdout)
        f.write(subprocess.run(["tmux", "capture-pane", "-p", "-t", f"bench{os.getpid()}"],
                               capture_output=True, text=True).stdout)


def _screen(session: str) -> None:
    """The dashboard as it draws mid-run, into $OUT/screen.txt (where OUT is set)."""
    shown = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                           text=True).stdout
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "screen.txt"), "w") as f:
            f.write(shown)


def what_the_log_says(log: str) -> None:
    events = [json.loads(line) for line in open(log)]
    for e in events:
        if e["kind"] == "rank" and e.get("state") in ("running", "stalled", "waiting", "done") \
                and e.get("reason"):
            print(f"  rank {e['rank']} {e['state']} pid {e.get('pid')} gpu {e.get('gpu')}: "
                  f"{e['reason'][:160]}")
        if e["kind"] == "message" and e.get("stacks_of") is not None:
            print(f"  {e['text'][:200]}")
    mem = [e.get("gpu_mem") for e in events if e["kind"] == "process" and e.get("gpu_mem")]
    print(f"  GPU memory of rank 0's processes, most: {max(mem or [0]):,} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--stall", action="store_true", help="then one run whose rank 0 hangs")
    ap.add_argument("--tmux", action="store_true", help="ddptui with its dashboard in tmux")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    script_args = ["--model", args.model, "--steps", str(args.steps), "--warmup",
                   str(args.warmup)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    rates: dict[str, list[float]] = {"plain": [], "ddptui": []}
    log = ""  # the last ddptui run's
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for v in (("plain", "ddptui") if r % 2 == 0 else ("ddptui", "plain")):
                rate, ran = one(v == "ddptui", script_args, env, tmp,
                                tmux=args.tmux and v == "ddptui")
                log = ran if v == "ddptui" else log
                rates[v].append(rate)
                print(f"round {r} {v}: {rate:,.0f} img/s", flush=True)
        print("\nthe last ddptui run's log:")
        what_the_log_says(log)
        if args.stall:
            _, log = one(True, [*script_args, "--hang-at", "100", "--hang-s", "25"], env, tmp,
                         ["--stall-after", "5"])
            print("\na run whose rank 0 sleeps 25 s at step 100 (--stall-after 5):")
            what_the_log_says(log)
    base = statistics.mean(rates["plain"])
    print("\n| variant | img/s (each round) | mean | ratio to plain |\n|---|---|---|---|")
    for v, xs in rates.items():
        print(f"| {v} | {', '.join(f'{x:,.0f}' for x in xs)} | {statistics.mean(xs):,.0f} | "
              f"{statistics.mean(xs) / base:.4f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rates": rates, "ratio": statistics.mean(rates["ddptui"]) / base}, f)


if __name__ == "__main__":
    main()
