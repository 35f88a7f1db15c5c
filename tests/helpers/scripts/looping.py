"""A script that trains nothing: it prints a loss line ten times a second, with a tqdm-style
progress line in between, until told otherwise.

    --stuck-rank N   rank N stops printing and sleeps in stuck_here() (a hang in Python)
    --fail-first     rank 1 fails at once on the first attempt (TORCHELASTIC_RESTART_COUNT 0);
                     the others of that attempt run until ended, as a peer waiting on it would
    --steps N        end after N lines (default: never)
"""

import argparse
import os
import sys
import time


def stuck_here() -> None:
    time.sleep(3600)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stuck-rank", type=int, default=None)
    p.add_argument("--fail-first", action="store_true")
    p.add_argument("--steps", type=int, default=None)
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    if args.fail_first and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        if rank == 1:
            raise ValueError("the first attempt of rank 1 fails")
        args.steps = None
    step = 0
    while args.steps is None or step < args.steps:
        if rank == args.stuck_rank and step == 5:
            stuck_here()
        sys.stdout.write(f"\rEpoch {step // 20}: {step % 20 * 5}%|##  | loss=0.{step:03d}")
        print(f"\nepoch {step // 20} step {step} loss: {1 / (step + 1):.4f}", flush=True)
        step += 1
        time.sleep(0.1)
    print(f"rank {rank} finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
