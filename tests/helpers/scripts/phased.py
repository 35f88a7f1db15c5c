"""A torchrun script with one rank made slow in one phase of its step, for the phases' tests:
as a user writes it (no ddptui line), or with ddptui's three lines (--api).

    --api                ddptui.init(), run.loader(), run.epochs() and run.step()
    --epochs N           epochs of --steps steps (batch 64 a rank)
    --slow PHASE         forward | data | after-backward | none: where --rank sleeps --ms
    --keep-mib M         --rank keeps one tensor of M MiB more each epoch (memory creep)
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Points(Dataset):
    """Random points of 4 classes; `delay` s a sample on the slow rank."""

    def __init__(self, n: int, delay: float):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randint(0, 4, (n,), generator=g)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


class Net(nn.Module):
    def __init__(self, delay: float):
        super().__init__()
        # Milliseconds of compute a step for few parameters: gloo's all-reduce stays small
        self.body = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                  nn.Linear(512, 4))
        self.delay = delay

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.body(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--api", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--slow", default="none")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--ms", type=float, default=30.0)
    p.add_argument("--keep-mib", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = rank == args.rank
    delay = args.ms / 1000 if mine else 0.0
    run = None
    if args.api:
        import ddptui

        run = ddptui.init()
    torch.manual_seed(0)
    model = DDP(Net(delay if args.slow == "forward" else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batch = 64
    data = Points(args.steps * batch * world, delay / batch if args.slow == "data" else 0.0)
    sampler = DistributedSampler(data, shuffle=True)
    loader = run.loader(data, batch_size=batch, sampler=sampler) if run else \
        DataLoader(data, batch_size=batch, sampler=sampler)
    kept = []
    epochs = run.epochs(args.epochs, loader) if run else range(args.epochs)
    for epoch in epochs:
        if not run:
            sampler.set_epoch(epoch)
        if mine and args.keep_mib:
            kept.append(torch.ones(args.keep_mib << 18))  # float32: M MiB, written (resident)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if args.slow == "after-backward" and mine:
                time.sleep(delay)
            opt.step()
            if run:
                run.step(loss, samples=len(x))
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
