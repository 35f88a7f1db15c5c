"""What ddptui's telemetry and NVML sampling cost a step: the same headless run with them on
(--telemetry-hz 4, the default) and off (--telemetry-hz 0: no step events, no device sampler).

python bench/telemetry_cost.py --model resnet18 --gpus 2
Without step events the rate comes from epoch events: two runs of each kind with different step
counts, differenced, so start-up and warm-up cancel out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def epoch_seconds(model: str, gpus: int, steps: int, hz: float) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "run.jsonl")
        subprocess.run([sys.executable, "-m", "ddptui", "run", model, "--headless",
                        "--gpus", ",".join(map(str, range(gpus))), "--data", "synthetic",
                        "--amp", "bf16", "--channels-last", "--batch-size", "256",
                        "--epochs", "1", "--steps-per-epoch", str(steps),
                        "--telemetry-hz", str(hz), "--log", log],
                       check=True, capture_output=True, cwd=tmp)
        evs = [json.loads(line) for line in open(log)]
    return max(e["seconds"] for e in evs if e["kind"] == "epoch")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--short", type=int, default=100)
    ap.add_argument("--long", type=int, default=600)
    args = ap.parse_args()
    print("| telemetry | img/s (differenced) | step ms |")
    print("|---|---|---|")
    rates = {}
    for hz in (4.0, 0.0, 4.0, 0.0):  # interleaved, so drift hits both alike
        extra = epoch_seconds(args.model, args.gpus, args.long, hz) - \
            epoch_seconds(args.model, args.gpus, args.short, hz)
        steps = args.long - args.short
        rate = steps * 256 * args.gpus / extra
        rates.setdefault(hz, []).append(rate)
        print(f"| {'on (4 Hz + NVML)' if hz else 'off'} | {rate:,.0f} | "
              f"{1000 * extra / steps:.3f} |", flush=True)
    on, off = (sum(rates[h]) / len(rates[h]) for h in (4.0, 0.0))
    print(f"\nmean on {on:,.0f}, off {off:,.0f}: telemetry costs {100 * (off - on) / off:+.2f}% "
          "of a step")


if __name__ == "__main__":
    main()
