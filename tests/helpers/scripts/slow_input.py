"""A script on run.loader whose samples take 3 ms each to load, with no workers: its ranks wait
for their input most of each step (the input watch's test)."""

import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import Dataset, DistributedSampler

import ddptui


class Slow(Dataset):
    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.full((3, 8, 8), float(i % 4)), i % 4


def main() -> None:
    dist.init_process_group("gloo")
    data = Slow()
    sampler = DistributedSampler(data)
    net = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(192, 4)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    run = ddptui.init()
    loader = run.loader(data, batch_size=16, sampler=sampler, num_workers=0)
    for _ in run.epochs(1, sampler):
        for x, y in loader:
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            run.step(loss, samples=len(x))
            if run.should_stop:
                break
    run.done()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
