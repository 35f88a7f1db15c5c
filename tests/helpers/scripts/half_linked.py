"""A torchrun script whose rank 0 reports to the address given and whose rank 1 has no link, as
when DDPTUI_REPORT is set on one node only."""

import sys

import torch
import torch.distributed as dist

import ddptui

dist.init_process_group("gloo")
rank = dist.get_rank()
run = ddptui.init(sys.argv[1] if rank == 0 else None)
for step in range(20):
    t = torch.ones(1)
    dist.all_reduce(t)
    run.step(loss=float(step), samples=1)
print(f"rank {rank} finished", flush=True)
dist.destroy_process_group()
