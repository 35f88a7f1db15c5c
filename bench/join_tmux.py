"""A join through the dashboard (issue 14 part 2): the app in tmux, `s` on the last rank, then
`r` once its standby is warm, sent through tmux as a user would; figures from the ranks' events,
as bench/elastic.py gives them for the same change driven through the supervisor API.

python bench/join_tmux.py resnet18 --gpus 0,1 --data synthetic --amp bf16 --channels-last \
    --batch-size 256 [--rounds 3] [--keep DIR]
Prints, per round: key -> the joiner's first step on N ranks, and the longest stall of a rank
that stayed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from ddptui.contract.jsonl import read_records


def events(log: str) -> list[dict]:
    return read_records(log) if os.path.exists(log) else []  # a half-written line is skipped


def wait(log: str, predicate, what: str, timeout: float = 300) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [e for e in events(log) if predicate(e)]
        if found:
            return found
        time.sleep(0.05)
    raise SystemExit(f"join_tmux: {what} not seen in {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [--rounds N] [--keep DIR] MODEL "
                                     "[ddptui run options]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="a folder to copy the run's log into, for a closer look")
    known, args = parser.parse_known_args()
    rounds, keep = known.rounds, known.keep
    tmp = tempfile.mkdtemp()
    log, session = os.path.join(tmp, "run.jsonl"), f"join{os.getpid()}"
    cmd = [sys.executable, "-m", "ddptui", "run", *args, "--epochs", "1000", "--log", log]
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "50",
                    f"cd {shlex.quote(tmp)} && {shlex.join(cmd)}"], check=True)

    def keys(*k: str) -> float:
        t = time.time()
        subprocess.run(["tmux", "send-keys", "-t", session, *k], check=True)
        return t

    try:
        wait(log, lambda e: e["kind"] == "step" and e["global_step"] >= 30, "30 steps")
        size = next(e["size"] for e in events(log) if e["kind"] == "world")
        last = size - 1
        time.sleep(8)  # past autotuning and the first chart draws
        for _ in range(last):
            keys("Down")  # the ranks table's cursor on the last rank
        for n in range(rounds):
            t = keys("s")
            wait(log, lambda e, t=t: e["kind"] == "rank" and e["rank"] == last and e["t"] > t
                 and e.get("standby") == "ready", "a warm standby after s")
            time.sleep(3)
            t = keys("r")
            firsts = wait(log, lambda e, t=t: e.get("change_s") is not None and e["t"] > t
                          and e.get("world_size") == size and e["rank"] == last,
                          "the joiner's first step")
            time.sleep(2)
            stayed = [e["change_s"] for e in events(log) if e.get("change_s") is not None
                      and e["t"] > t and e["rank"] != last]
            print(json.dumps({"round": n, "world": size,
                              "key_to_first_step_s": round(firsts[0]["t"] - t, 3),
                              "longest_stall_of_a_rank_that_stayed_s": max(stayed, default=None)}),
                  flush=True)
            time.sleep(4)
    finally:
        keys("q")
        time.sleep(5)
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        if keep:
            shutil.copy(log, keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
