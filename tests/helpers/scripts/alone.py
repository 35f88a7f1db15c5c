"""Ranks that train on their own, with no process group (a sweep: one process per GPU, each its
own model): the three lines still take the dashboard's orders, each rank for itself."""

import time

import torch

import ddptui

run = ddptui.init()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _epoch in run.epochs(100_000):
    for _ in range(20):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.step(loss, samples=8)
        time.sleep(0.01)
        if run.should_stop:
            break
    if run.should_stop:
        break
print(f"rank {run.rank}: stopped at step {run.global_step}")
