"""What one scrape of --metrics costs as ranks grow: a run state fed a job's events (each rank
stepping, its GPU read), then /metrics rendered as prometheus_client serves it.

python bench/metrics_scrape.py --ranks 8 64 512 --scrapes 20
- time: the median of --scrapes renders of the whole exposition (the collector reading the
  state under its lock, and prometheus_client's text format), on this machine's one core;
- size: the bytes of one exposition (text format).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from ddptui.contract.monitor.metrics import RunCollector  # noqa: E402
from ddptui.contract.protocol.events import Gpu, Rank, Run, Step  # noqa: E402
from ddptui.contract.state.runstate import RunState  # noqa: E402


def job(ranks: int, per_node: int = 8) -> RunState:
    state = RunState({"model": "resnet50"})
    now = time.time()
    state.apply(Run(t=now, rank=0, status="started", model="resnet50", world_size=ranks,
                    device_kind="cuda"))
    for r in range(ranks):
        node = f"gpu{r // per_node:03d}/{r // per_node}"
        state.apply(Rank(t=now, rank=r, state="running", pid=1000 + r, local_rank=r % per_node,
                         node=node))
        for i in range(50):
            state.apply(Step(t=now + i, rank=r, epoch=0, step=i, global_step=i, loss=1.0,
                             steps=20, samples_per_s=2900.0, step_ms=88.0, data_wait=0.02,
                             node=node))
        state.apply(Gpu(t=now + 50, rank=r, gpu=r % per_node, util=97.0, mem_used=31200,
                        mem_total=81559, power_w=650.0, held_down=["power cap"],
                        uuid=f"GPU-{r:08x}-0000-0000-0000-000000000000", node=node))
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    ap.add_argument("--scrapes", type=int, default=20)
    args = ap.parse_args()
    print("| ranks | scrape ms (median) | scrape ms (max) | bytes | series |")
    print("|---|---|---|---|---|")
    for n in args.ranks:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(RunCollector(job(n), "bench"))
        times, body = [], b""
        for _ in range(args.scrapes):
            t0 = time.perf_counter()
            body = generate_latest(registry)
            times.append(1000 * (time.perf_counter() - t0))
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        print(f"| {n} | {statistics.median(times):.1f} | {max(times):.1f} | {len(body):,} | "
              f"{series:,} |", flush=True)


if __name__ == "__main__":
    main()
