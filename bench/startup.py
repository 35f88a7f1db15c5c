"""Launch to first step of the built-in loop, for this checkout and others side by side (an older
commit's tree, to show what a change to how ranks start did): runs alternate between the roots.

python bench/startup.py --gpus 0,1 --runs 3 --root . --root .old/fcb0306
After a warm-up run of each (not counted), each run: `ddptui run resnet18 --gpus GPUS
--headless --data synthetic --amp bf16 --channels-last --epochs 1 --steps-per-epoch 20`;
seconds from the launch to rank 0's first step and to the run's end, and a Markdown table per
root (min, median, max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from ddptui.contract.jsonl import read_records


def run_once(root: str, gpus: str, work: str, n: int) -> dict:
    log = os.path.join(work, f"startup-{os.path.basename(os.path.abspath(root))}-{n}.jsonl")
    cmd = [sys.executable, "-m", "ddptui", "run", "resnet18", "--gpus", gpus, "--headless",
           "--data", "synthetic", "--amp", "bf16", "--channels-last", "--epochs", "1",
           "--steps-per-epoch", "20", "--log", log]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.abspath(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p and os.path.abspath(p) != os.getcwd()]))
    t0 = time.time()
    p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    end = time.time() - t0
    steps = [e["t"] for e in read_records(log) if e["kind"] == "step" and e["rank"] == 0] \
        if os.path.exists(log) else []
    return {"root": root, "run": n, "exit": p.returncode, "end_s": round(end, 2),
            "first_step_s": round(steps[0] - t0, 2) if steps else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="0,1")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="runs of each root first, not counted (the first fills the bytecode cache)")
    p.add_argument("--root", action="append", default=None, help="a checkout (default: .)")
    p.add_argument("--work", default="/tmp/startup")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "startup.json"))
    args = p.parse_args()
    roots = args.root or ["."]
    os.makedirs(args.work, exist_ok=True)
    results = []
    for n in range(args.warmup + args.runs):
        for root in roots:
            results.append(run_once(root, args.gpus, args.work, n))
            print(json.dumps(results[-1]), flush=True)
    results = [r for r in results if r["run"] >= args.warmup]
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print("\n| checkout | runs | exit 0 | first step (min, median, max s) | whole run (median s) |")
    print("|---|---|---|---|---|")
    for root in roots:
        mine = [r for r in results if r["root"] == root]
        first = sorted(r["first_step_s"] for r in mine if r["first_step_s"] is not None)
        ok = sum(r["exit"] == 0 for r in mine)
        spread = f"{first[0]}, {statistics.median(first)}, {first[-1]}" if first else "-"
        print(f"| {root} | {len(mine)} | {ok} | {spread} | "
              f"{statistics.median(r['end_s'] for r in mine)} |")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
