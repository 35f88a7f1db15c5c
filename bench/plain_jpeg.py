"""The input-pipeline baseline: a hand-written torchrun script with the best plain loader
(ImageFolder, RandomResizedCrop + flip in DataLoader workers, pinned memory, persistent workers,
an APEX-style CUDA prefetcher), resnet18 bf16 channels_last. No ddptui code.

torchrun --standalone --nproc-per-node 2 bench/plain_jpeg.py /data/jpeg --workers 12 [--epochs 3]
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


def batches(loader, mean, std):
    stream = torch.cuda.Stream()
    nxt = None
    for x, y in loader:
        with torch.cuda.stream(stream):
            x = x.cuda(non_blocking=True).float().sub_(mean).div_(std)
            x = x.contiguous(memory_format=torch.channels_last)
            y = y.cuda(non_blocking=True)
        if nxt is not None:
            yield nxt
        torch.cuda.current_stream().wait_stream(stream)
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        nxt = (x, y)
    if nxt is not None:
        yield nxt


def epochs(loader, n: int, mean, std):
    for epoch in range(n):
        loader.sampler.set_epoch(epoch)
        yield from batches(loader, mean, std)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--epochs", type=int, default=1,
                    help="more than one: the batches queued while the model started weigh less")
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.backends.cudnn.benchmark = True
    tf = transforms.Compose([transforms.RandomResizedCrop(224, scale=(0.35, 1.0), antialias=True),
                             transforms.RandomHorizontalFlip(), transforms.PILToTensor()])
    data = datasets.ImageFolder(os.path.join(args.root, "train"), tf)
    loader = DataLoader(data, args.batch_size, sampler=DistributedSampler(data), drop_last=True,
                        num_workers=args.workers, pin_memory=True, persistent_workers=True,
                        prefetch_factor=4)
    model = torchvision.models.resnet18(num_classes=len(data.classes)).cuda()
    model = DDP(model.to(memory_format=torch.channels_last), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    steps = 0
    for step, (x, y) in enumerate(epochs(loader, args.epochs, mean, std)):
        if step == args.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps = step + 1 - args.warmup
    torch.cuda.synchronize()
    rate = steps * args.batch_size * dist.get_world_size() / (time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(json.dumps({"img_s": rate, "workers": args.workers, "steps": steps}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
