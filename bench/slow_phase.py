"""A torchrun script with one phase of its step made slow on purpose from an epoch on, as a user
writes it (no ddptui line), for bench/phases.py --named: on a GPU (NCCL) or, without one, on CPU.

torchrun --standalone --nproc-per-node 1 bench/slow_phase.py --slow forward --ms 30
resnet18 on random images from a DataLoader (in the main process, so a slow dataset is
data-wait), bf16 autocast on a GPU; --slow forward sleeps in the model's forward, --slow data in
the dataset, each --ms a batch, from --from-epoch on.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Images(Dataset):
    """Random images, the same every epoch; `delay` s a sample while `slow` is set."""

    def __init__(self, n: int, size: int, delay: float):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 3, size, size, generator=g)
        self.n, self.delay, self.slow = n, delay, False

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self.slow:
            time.sleep(self.delay)
        return self.x[i % 64], i % 10


class Slow(torch.nn.Module):
    """The model, with a sleep in its forward while `slow` is set."""

    def __init__(self, body: torch.nn.Module, delay: float):
        super().__init__()
        self.body, self.delay, self.slow = body, delay, False

    def forward(self, x):
        if self.slow:
            time.sleep(self.delay)
        return self.body(x)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slow", choices=("forward", "data", "none"), default="none")
    ap.add_argument("--ms", type=float, default=30.0)
    ap.add_argument("--from-epoch", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="steps an epoch")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--image-size", type=int, default=224)
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()
    delay = args.ms / 1000
    body = torchvision.models.resnet18(num_classes=10).to(device, memory_format=torch.channels_last)
    model = Slow(body, delay if args.slow == "forward" else 0.0)
    ddp = DDP(model, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    data = Images(args.steps * args.batch_size * world, args.image_size,
                  delay / args.batch_size if args.slow == "data" else 0.0)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, pin_memory=cuda,
                        drop_last=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.slow = data.slow = epoch >= args.from_epoch
        for x, y in loader:
            x = x.to(device, non_blocking=True).to(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
                loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
