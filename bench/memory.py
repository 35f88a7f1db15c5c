"""GPU memory (nvidia-smi, the peak while training) and img/s of ddptui against the plain script
on one GPU, and what a checkpoint stalls the loop, in one call on the same GPU.

python bench/memory.py --models resnet18 resnet50 vit_b_16 --optimizer adamw [--old DIR]
--old DIR: also run the ddptui tree in DIR (an older commit, `git archive`d) for before/after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import ours, plain  # noqa: E402


@contextlib.contextmanager
def peak_memory(gpu: int = 0):
    """Polls nvidia-smi twice a second; yields a dict whose 'mib' is the peak seen."""
    seen, stop = {"mib": 0}, threading.Event()

    def poll() -> None:
        while not stop.wait(0.5):
            out = subprocess.run(["nvidia-smi", "-i", str(gpu), "--query-gpu=memory.used",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True)
            if out.stdout.strip().isdigit():
                seen["mib"] = max(seen["mib"], int(out.stdout.strip()))

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def tree_env(tree: str | None) -> dict:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
    return env


def optimizer(args) -> list[str]:
    # SGD is the default, and the only optimizer of trees older than --optimizer.
    return [] if args.optimizer == "sgd" else ["--optimizer", args.optimizer]


def measure(model: str, args, tree: str | None, extra: list[str]) -> dict:
    with peak_memory() as mem:
        result = ours(model, 1, args.steps, args.warmup, [*optimizer(args), *extra],
                      env=tree_env(tree))
    return {**result, "mib": mem["mib"]}


def checkpoint_stall(model: str, args, tree: str | None) -> dict:
    """Seconds a checkpoint adds to the loop: the same steps with and without a checkpoint
    every `--checkpoint-every` steps, differenced, per checkpoint."""
    with tempfile.TemporaryDirectory() as ck:
        every = ["--checkpoint-dir", ck, "--checkpoint-every", str(args.checkpoint_every)]
        base = ours(model, 1, args.steps, args.warmup, optimizer(args), env=tree_env(tree))
        saving = ours(model, 1, args.steps, args.warmup, [*optimizer(args), *every],
                      env=tree_env(tree))
    n = args.steps // args.checkpoint_every
    step_s = 256 / base["img_s"]
    stall = (256 * args.steps / saving["img_s"] - 256 * args.steps / base["img_s"]) / n
    return {"img_s": base["img_s"], "img_s_saving": saving["img_s"], "checkpoints": n,
            "stall_s": stall, "stall_steps": stall / step_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "vit_b_16"])
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--old", default=None, help="an older ddptui tree, for before/after")
    ap.add_argument("--checkpoint-model", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    if args.checkpoint_model:
        for label, tree in (("new", None), ("old", args.old)):
            if label == "old" and not tree:
                continue
            row = {"checkpoint": label, **checkpoint_stall(args.checkpoint_model, args, tree)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| model | plain MiB | ddptui MiB | ratio | plain img/s | ddptui img/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        with peak_memory() as mem:
            p = plain(model, 1, args.steps, args.warmup, ("--optimizer", args.optimizer))
        p["mib"] = mem["mib"]
        runs = {"ddptui": measure(model, args, None, [])}
        if args.old:
            runs["ddptui (before)"] = measure(model, args, args.old, [])
        for label, o in runs.items():
            rows.append({"model": model, "label": label, "plain": p, "ours": o})
            print(f"| {model} {label} | {p['mib']:,} | {o['mib']:,} | {o['mib'] / p['mib']:.3f} | "
                  f"{p['img_s']:,.0f} | {o['img_s']:,.0f} | {o['img_s'] / p['img_s']:.3f} |",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
