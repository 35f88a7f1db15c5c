"""A plain torchrun script, as the PyTorch DDP tutorial writes one: nothing of ddptui in it.

    torchrun --standalone --nproc-per-node 2 examples/plain_ddp.py --epochs 3
    ddptui run examples/plain_ddp.py --cpus 2 -- --epochs 3     # the same, watched

A small CNN on random images (no download); NCCL on GPUs, gloo on CPUs.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def get_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--fail-at-epoch", type=int, default=None, help="raise on rank 1 (tests)")
    p.add_argument("--hang-at-epoch", type=int, default=None, help="sleep on rank 1 (tests)")
    p.add_argument("--device-id", action="store_true",
                   help="init_process_group(device_id=...): NCCL's communicator made at once")
    p.add_argument("--setup-seconds", type=float, default=0.0,
                   help="set-up before the process group, as reading a dataset takes (tests)")
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="each forward waits this long, as a GPU's host does (tests: little CPU)")
    return p.parse_args()


def model(classes: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                         nn.Flatten(), nn.Linear(16 * 16, classes))


def setup(args: argparse.Namespace, wrap=DDP):
    """The process group, the data and its DistributedSampler, the DDP model."""
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    time.sleep(args.setup_seconds)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo",
                            device_id=device if cuda and args.device_id else None)
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    images = torch.randn(args.samples, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 10, (args.samples,))
    data = TensorDataset(images, labels)
    sampler = DistributedSampler(data)
    module = model(10)
    if args.step_seconds:
        module.register_forward_pre_hook(lambda *_: time.sleep(args.step_seconds))
    net = wrap(module.to(device), device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    return device, data, sampler, net, opt


def misbehave(args: argparse.Namespace, epoch: int) -> None:
    """--fail-at-epoch, --hang-at-epoch: rank 1 fails or hangs, as a real bug would."""
    if dist.get_rank() == 1 and epoch == args.fail_at_epoch:
        raise RuntimeError(f"rank 1 gave up at epoch {epoch}")
    if dist.get_rank() == 1 and epoch == args.hang_at_epoch:
        time.sleep(3600)


def main() -> None:
    args = get_args()
    device, data, sampler, net, opt = setup(args)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, pin_memory=device.type == "cuda")
    rank = dist.get_rank()
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        misbehave(args, epoch)
        start = time.time()
        for step, (x, y) in enumerate(loader):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_fn(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 5 == 0:
                print(f"rank {rank} epoch {epoch} step {step} loss: {loss.item():.4f}",
                      flush=True)
        if rank == 0:
            print(f"epoch {epoch} done in {time.time() - start:.2f} s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
