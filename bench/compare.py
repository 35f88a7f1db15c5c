"""ddptui vs the plain torchrun script, in one call on the same GPUs; prints a markdown table.

python bench/compare.py --models resnet18 resnet50 --gpus 1 2 [--tmux] --out results.json
Each row: the plain script's img/s, ddptui run --headless img/s (--tmux: with the dashboard
drawing in tmux) over the same steady window (from its step events), their ratio, and
launch -> first step for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plain(model: str, gpus: int, steps: int, warmup: int, extra: tuple[str, ...] = ()) -> dict:
    env = dict(os.environ, BENCH_T0=str(time.time()))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", str(gpus), os.path.join(ROOT, "bench/plain_ddp.py"),
                          "--model", model, "--steps", str(steps), "--warmup", str(warmup),
                          *extra], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def ours(model: str, gpus: int, steps: int, warmup: int, extra: list[str],
         tmux: bool = False, env: dict | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "run.jsonl")
        cmd = [sys.executable, "-m", "ddptui", "run", model, "--gpus",
               ",".join(map(str, range(gpus))), "--data", "synthetic", "--amp", "bf16",
               "--channels-last", "--batch-size", "256", "--epochs", "1",
               "--steps-per-epoch", str(warmup + steps), "--log", log, *extra]
        t0 = time.time()
        if tmux:
            in_tmux(cmd, log, tmp)
        else:
            subprocess.run([*cmd, "--headless"], check=True, capture_output=True, cwd=tmp,
                           env=env)
        evs = [json.loads(line) for line in open(log)]
    steps_ev = [e for e in evs if e["kind"] == "step" and e["rank"] == 0]
    window = [e for e in steps_ev if e["global_step"] >= warmup]
    a, b = window[0], window[-1]
    img_s = (b["global_step"] - a["global_step"]) * 256 * gpus / (b["t"] - a["t"])
    marks = {e["text"].split(":")[0]: round(e["t"] - t0, 2) for e in evs
             if e["kind"] == "message" and e["rank"] == 0}  # the rank's start-up, for the JSON
    return {"img_s": img_s, "first_step_s": steps_ev[0]["t"] - t0, "start_up": marks}


def in_tmux(cmd: list[str], log: str, cwd: str) -> None:
    """The dashboard drawing in a 160x50 tmux window for the whole run; q once it is done."""
    session, exit_file = f"bench{os.getpid()}", os.path.join(cwd, "exit")
    if os.path.exists(exit_file):  # an earlier run's in the same folder: wait for this one's
        os.remove(exit_file)
    shell = f"cd {shlex.quote(cwd)} && {shlex.join(cmd)}; echo $? > {shlex.quote(exit_file)}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50", shell],
                   check=True)
    while not _ended(log):
        time.sleep(1)
    subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
    while not os.path.exists(exit_file):
        time.sleep(0.5)


def _ended(log: str) -> bool:
    if not os.path.exists(log):
        return False
    runs = [json.loads(line) for line in open(log) if '"kind":"run"' in line]
    return any(e["status"] in ("done", "failed", "interrupted") for e in runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet18"])
    ap.add_argument("--gpus", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--out", default=None)
    ap.add_argument("--tmux", action="store_true", help="ddptui with its dashboard in tmux")
    ap.add_argument("--extra", default="", help='more ddptui run options, one string: '
                    '--extra="--strategy dp"')
    args = ap.parse_args()
    rows = []
    print("| model | GPUs | plain img/s | ddptui img/s | ratio | first step plain / ddptui (s) |")
    print("|---|---|---|---|---|---|")
    for model in args.models:
        for gpus in args.gpus:
            p = plain(model, gpus, args.steps, args.warmup)
            o = ours(model, gpus, args.steps, args.warmup, shlex.split(args.extra), args.tmux)
            row = {"model": model, "gpus": gpus, "plain": p, "ddptui": o,
                   "ratio": o["img_s"] / p["img_s"]}
            rows.append(row)
            print(f"| {model} | {gpus} | {p['img_s']:,.0f} | {o['img_s']:,.0f} | "
                  f"{row['ratio']:.3f} | {p['first_step_s']:.1f} / {o['first_step_s']:.1f} |",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
