"""NCCL all-reduce bus bandwidth on this machine's GPUs under the environment given: what an NCCL
setting that ddptui's ranks start with costs DDP's gradient all-reduces.

torchrun --standalone --nproc-per-node 2 bench/allreduce.py
NCCL_CUMEM_ENABLE=0 torchrun --standalone --nproc-per-node 2 bench/allreduce.py
Prints one JSON line: GB/s of bus bandwidth per message size (nccl-tests' busbw: 2(n-1)/n x
bytes / time), the median of 5 timed runs of 20 all-reduces each, bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 32, 128, 512], metavar="MB",
                   help="message sizes in MB")
    args = p.parse_args()
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    result = {"env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
              "ranks": n, "busbw_gbs": {}}
    for mb in args.sizes:
        x = torch.ones(mb * 2**20 // 2, dtype=torch.bfloat16, device=device)
        for _ in range(5):
            dist.all_reduce(x)
        runs = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                dist.all_reduce(x)
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) / 20 / 1000)
        busbw = 2 * (n - 1) / n * mb * 2**20 / statistics.median(runs) / 1e9
        result["busbw_gbs"][f"{mb} MB"] = round(busbw, 1)
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
