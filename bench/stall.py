"""What a hung rank costs, and whether the dashboard's GPU memory matches nvidia-smi: one run
driven through the supervisor API on 2 GPUs.

python bench/stall.py resnet18 --gpus 0,1 --data synthetic --amp bf16 --channels-last \
    --batch-size 256 --out stall.json
Rows: SIGSTOP of the last rank inside NCCL collectives -> seconds to the `stalled` flag (and to
its stacks message); `k` (kill_rank) -> seconds to the first step on N-1; then the memory each
GPU event reported beside nvidia-smi's reading taken in the same second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.elastic import Bench, start  # noqa: E402


def smi_memory() -> dict[int, int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,"
                          "nounits"], capture_output=True, text=True).stdout
    return {int(i): int(m) for i, m in (line.split(",") for line in out.strip().splitlines())}


def memory_rows(b: Bench, samples: int = 5) -> list[dict]:
    rows = []
    for _ in range(samples):
        t, smi = time.time(), smi_memory()
        time.sleep(0.6)  # the parent samples every 0.5 s
        for gpu, used in smi.items():
            near = [e for e in b.events("gpu") if e.get("gpu") == gpu and abs(e["t"] - t) < 0.6]
            if near:
                ours = min(near, key=lambda e: abs(e["t"] - t))
                rows.append({"gpu": gpu, "nvidia_smi_mib": used, "ddptui_mib": ours["mem_used"],
                             "dt_s": round(ours["t"] - t, 2)})
    return rows


def main() -> int:
    sup, b, args = start(__doc__, "stall")
    memory = memory_rows(b)
    last = max(sup.members)
    b.stayers = set(sup.members) - {last}
    t0 = time.time()
    os.kill(sup.slots[last].process.pid, signal.SIGSTOP)

    def flagged(state: str, rank: int):
        return next((e for e in b.events("rank") if e["rank"] == rank and e.get("state") == state
                     and e["t"] >= t0), None)

    b.wait(lambda: flagged("stalled", last), "the stalled flag", 120)
    b.wait(lambda: any(e.get("stacks_of") == last and e["t"] >= t0 for e in b.events("message")),
           "the stacks message", 30)
    stall = flagged("stalled", last)
    stacks = next(e for e in b.events("message") if e.get("stacks_of") == last and e["t"] >= t0)
    waiting = [flagged("waiting", r) for r in b.stayers]
    row = {"sigstop_to_stalled_s": round(stall["t"] - t0, 2),
           "stall_limit_s": stall.get("seconds"), "process": stall.get("process"),
           "gpu": stall.get("gpu_activity"), "others_waiting": all(waiting),
           "sigstop_to_stacks_message_s": round(stacks["t"] - t0, 2)}
    print(row, flush=True)
    kill = b.change(f"k: kill stalled rank {last}", 1, lambda: sup.kill_rank(last))
    sup.stop()
    code = sup.wait(120)
    with open(args.out, "w") as f:
        json.dump({"stall": row, "kill": kill, "memory": memory}, f, indent=1)
    print("| GPU | nvidia-smi MiB | ddptui MiB | reading dt (s) |\n|---|---|---|---|")
    for m in memory:
        print(f"| {m['gpu']} | {m['nvidia_smi_mib']:,} | {m['ddptui_mib']:,} | {m['dt_s']} |")
    return 0 if code in (0, 130) else 1


if __name__ == "__main__":
    sys.exit(main())
