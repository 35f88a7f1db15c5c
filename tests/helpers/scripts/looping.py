"""A script that trains nothing: it prints a loss line ten times a second, with a tqdm-style
progress line in between, until told otherwise.

    --stuck-rank N   rank N stops printing and sleeps in stuck_here() (a hang in Python)
    --deaf           ... deaf to SIGINT and SIGTERM there, as a rank blocked in NCCL is
    --noise          ... while torch's C++ log goes on, as NCCL's watchdog writes when asked
                     for its flight recorder's dump (a line a second to stderr)
    --fail-first     rank 1 fails at once on the first attempt (TORCHELASTIC_RESTART_COUNT 0);
                     the others of that attempt run until ended, as a peer waiting on it would
    --steps N        end after N lines (default: never)
"""

import argparse
import os
import signal
import sys
import threading
import time


def stuck_here(deaf: bool, noise: bool) -> None:
    if deaf:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if noise:
        threading.Thread(target=watchdog_lines, daemon=True).start()
    time.sleep(3600)


def watchdog_lines() -> None:
    rank = os.environ["RANK"]
    while True:
        time.sleep(1.0)
        stamp = time.strftime("%m%d %H:%M:%S")
        print(f"[rank{rank}]:[E{stamp}.000000000 ProcessGroupNCCL.cpp:1234] [PG 0 Rank {rank}] "
              "Received a dump signal due to a collective timeout", file=sys.stderr, flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--stuck-rank", type=int, default=None)
    p.add_argument("--deaf", action="store_true")
    p.add_argument("--noise", action="store_true")
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
            stuck_here(args.deaf, args.noise)
        sys.stdout.write(f"\rEpoch {step // 20}: {step % 20 * 5}%|##  | loss=0.{step:03d}")
        print(f"\nepoch {step // 20} step {step} loss: {1 / (step + 1):.4f}", flush=True)
        step += 1
        time.sleep(0.1)
    print(f"rank {rank} finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
