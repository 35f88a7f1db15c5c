"""Your own script under ddptui against the same script under torchrun, in one call on the same
GPUs, alternating: the zero-code launch, and the script with ddptui's three lines.

python bench/script_overhead.py --gpus 1 --rounds 3 --out results.json
Variants per round: torchrun (bench/plain_ddp.py under torchrun --standalone), ddptui (the same
file under `ddptui run SCRIPT --headless`), ddptui+3 (its --ddptui flag: ddptui.init() and
run.step(loss, samples=n) every step, reporting to the parent), ddptui+elastic (--elastic:
run.elastic() on top, rollback points every 50 steps). --loader: every variant reads its batches
from host memory through a DataLoader (torchrun, ddptui) or run.loader() (ddptui+3,
ddptui+elastic). Prints a markdown table of the
img/s the script itself measured (rank 0, after its warm-up) and each variant's ratio to
torchrun's mean.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "plain_ddp.py")


def launch(variant: str, gpus: int, script_args: list[str], tmp: str) -> list[str]:
    if variant == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(gpus), SCRIPT, *script_args]
    extra = {"ddptui+3": ["--ddptui"], "ddptui+elastic": ["--elastic"]}.get(variant, [])
    return [sys.executable, "-m", "ddptui", "run", SCRIPT, "--gpus",
            ",".join(map(str, range(gpus))), "--headless", "--log",
            os.path.join(tmp, f"{variant}.jsonl"), "--", *script_args, *extra]


def measure(variant: str, gpus: int, script_args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(launch(variant, gpus, script_args, tmp), capture_output=True,
                             text=True, cwd=tmp, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                 p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
        if out.returncode != 0:
            raise SystemExit(f"{variant} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
        return json.loads(line)["img_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--loader", action="store_true", help="batches through a DataLoader")
    ap.add_argument("--workers", type=int, default=4, help="--loader: DataLoader workers")
    ap.add_argument("--variants", default="torchrun,ddptui,ddptui+3,ddptui+elastic",
                    help="which to run, comma-separated (torchrun is the reference)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    script_args = ["--model", args.model, "--steps", str(args.steps), "--warmup",
                   str(args.warmup),
                   *(["--loader", "--workers", str(args.workers)] if args.loader else [])]
    variants = tuple(args.variants.split(","))
    rates: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]  # neither goes first every time
        for v in order:
            rates[v].append(measure(v, args.gpus, script_args))
            print(f"round {r} {v}: {rates[v][-1]:,.0f} img/s", flush=True)
    base = statistics.mean(rates["torchrun"])
    print("\n| variant | img/s (each round) | mean | ratio to torchrun |\n|---|---|---|---|")
    for v in variants:
        mean = statistics.mean(rates[v])
        print(f"| {v} | {', '.join(f'{x:,.0f}' for x in rates[v])} | {mean:,.0f} | "
              f"{mean / base:.4f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "gpus": args.gpus, "rates": rates}, f, indent=1)


if __name__ == "__main__":
    main()
