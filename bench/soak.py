"""Full runs, again and again, counting crashes: the GPU paths' soak (--decode gpu and synthetic
data, one GPU and two). Lanes run side by side (one per GPU), each lane's runs one after another.

python bench/soak.py /tmp/jpeg --epochs 3 --lane resnet18:gpu:0:5 --lane resnet50:gpu:1:5
A lane is MODEL:DATA:GPUS:RUNS[:ROOT], DATA `gpu` (--decode gpu on the JPEG set), `cpu`
(--decode cpu) or `synthetic` (as many steps an epoch as the set has); ROOT runs another
checkout of ddptui (an older commit, to show what a fix fixed). Prints a Markdown table:
per lane the runs, those that ended 0, the crashes with the reason ddptui gave, seconds a run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from ddptui.contract.jsonl import read_records

RUNNING: set[subprocess.Popen] = set()  # the runs under way, ended with the soak


def stop_runs(signum, frame) -> None:
    """A soak cut short (bench/device.sh's timeout) ends its runs in order, not leave them on."""
    for p in list(RUNNING):
        p.terminate()
    sys.exit(128 + signum)


def run_once(args, model: str, data: str, gpus: str, root: str, n: int) -> dict:
    log = os.path.join(args.work, f"{model}-{data}-{gpus.replace(',', '')}-{n}.jsonl")
    cmd = [sys.executable, "-m", "ddptui", "run", model, "--gpus", gpus, "--headless",
           "--amp", "bf16", "--channels-last", "--batch-size", str(args.batch_size),
           "--epochs", str(args.epochs), "--log", log, *args.extra]
    if data == "synthetic":
        files = sum(len(f) for _, _, f in os.walk(args.jpegs))
        cmd += ["--data", "synthetic", "--steps-per-epoch", str(files // args.batch_size)]
    else:
        cmd += ["--data", f"imagefolder:{args.jpegs}", "--decode", data]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p != os.getcwd()]
        + [root]))
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    RUNNING.add(p)
    err = p.communicate()[1]
    RUNNING.discard(p)
    evs = read_records(log) if os.path.exists(log) else []
    crashed = [e["reason"] for e in evs if e["kind"] == "rank" and e.get("state") == "crashed"]
    ended = [e for e in evs if e["kind"] == "run" and e.get("status") in ("done", "failed")]
    epochs = {e["epoch"] for e in evs if e["kind"] == "epoch" and not e.get("partial")}
    return {"model": model, "data": data, "gpus": gpus, "root": root, "run": n,
            "exit": p.returncode, "seconds": round(time.time() - t0, 1), "epochs": len(epochs),
            "crashes": crashed, "reason": ended[-1].get("reason", "") if ended else "",
            "stderr": err[-400:] if p.returncode else ""}


def lane(args, spec: str, results: list) -> None:
    model, data, gpus, runs, *root = spec.split(":")
    for n in range(int(runs)):
        results.append(run_once(args, model, data, gpus, root[0] if root else os.getcwd(), n))
        r = results[-1]
        print(f"{spec} run {n}: exit {r['exit']}, {r['epochs']} epochs, {r['seconds']} s "
              f"{r['crashes'] or ''} {r['reason']}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("jpegs")
    p.add_argument("--lane", action="append", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--work", default="/tmp/soak")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "soak.json"))
    p.add_argument("extra", nargs="*", help="more ddptui options, after --")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    signal.signal(signal.SIGTERM, stop_runs)
    results: list = []
    threads = [threading.Thread(target=lane, args=(args, spec, results)) for spec in args.lane]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(args.out, "a") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print("\n| model | data | GPUs | code | runs | exit 0 | crashed | reasons | s a run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for spec in args.lane:
        model, data, gpus, _, *root = spec.split(":")
        rows = [r for r in results if (r["model"], r["data"], r["gpus"]) == (model, data, gpus)
                and r["root"] == (root[0] if root else os.getcwd())]
        bad = [r for r in rows if r["exit"] != 0]
        reasons = "; ".join(sorted({(r["crashes"] or [r["reason"] or f"exit {r['exit']}"])[0][:90]
                                    for r in bad}))
        print(f"| {model} | {data} | {gpus} | {'this' if not root else root[0]} | {len(rows)} | "
              f"{len(rows) - len(bad)} | {len(bad)} | {reasons or '-'} | "
              f"{sum(r['seconds'] for r in rows) / max(len(rows), 1):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
