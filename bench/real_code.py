"""Real code on a GPU, unchanged, under `ddptui run`: a rank that trains on NCCL and prints
nothing for minutes is never called stalled; Lightning on one GPU shows its per-step loss and
its epochs.

python bench/real_code.py --quiet-seconds 180 [--lightning-samples 256]
(`--quiet-seconds 0`: Lightning alone; more samples: longer epochs, more steps to show.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "tests", "helpers", "scripts")


def run(args: list[str], log: str) -> tuple[int, list[dict], float]:
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "ddptui", "run", "--headless", "--log", log,
                           *args], capture_output=True, text=True)
    evs = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-2000:])
    return done.returncode, evs, time.time() - t0


def quiet(seconds: float, tmp: str) -> None:
    """A rank on NCCL that prints nothing for `seconds`, at the default --stall-after."""
    code, evs, took = run(["--nproc-per-node", "1", os.path.join(SCRIPTS, "quiet.py"), "--",
                           "--cuda", "--silent", "--seconds", str(seconds)],
                          os.path.join(tmp, "quiet.jsonl"))
    flagged = [e for e in evs if e["kind"] == "rank" and e.get("state") == "stalled"]
    lines = [e for e in evs if e["kind"] in ("output", "lines")]
    print(f"a rank on NCCL, silent for {seconds:.0f} s, default --stall-after: exit {code} "
          f"after {took:.0f} s; stalled verdicts {len(flagged)}; output events {len(lines)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quiet-seconds", type=float, default=180.0)
    ap.add_argument("--lightning-samples", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.quiet_seconds > 0:
            quiet(args.quiet_seconds, tmp)
        script = os.path.join(SCRIPTS, "lightning_plain.py")
        code, evs, took = run([script, "--", "ddp", "gpu", "1", str(args.lightning_samples)],
                              os.path.join(tmp, "lightning.jsonl"))
        steps = [e for e in evs if e["kind"] == "step" and e.get("loss") is not None]
        epochs = sorted({e["epoch"] for e in evs if e["kind"] == "epoch"})
        distinct = len({e["global_step"] for e in steps})
        print(f"Lightning, accelerator gpu, devices 1, ddp: exit {code} after {took:.0f} s; "
              f"step events with a loss {len(steps)} ({distinct} steps); epoch rows for epochs "
              f"{epochs}")


if __name__ == "__main__":
    main()
