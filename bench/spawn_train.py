"""The other baseline: a DDP script that starts its own ranks, as the PyTorch ImageNet example
does (mp.spawn, one worker per GPU, tcp:// init_method, NCCL), with no ddptui code.

python bench/spawn_train.py --model resnet18 --steps 300
Synthetic data on the device, bf16 autocast, channels_last, SGD; rank 0 prints one JSON line
({"img_s": ...} over every rank, after --warmup). --hang-at N: rank 0 sleeps in its own code at
step N (a stall for the dashboard to flag, with its NCCL collective).
"""

import argparse
import json
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP


def main_worker(gpu: int, ngpus: int, port: int, args) -> None:
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=ngpus,
                            rank=gpu)
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.get_model(args.model, num_classes=1000).cuda()
    model = DDP(model.to(memory_format=torch.channels_last), device_ids=[gpu])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda")
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch_size,), device="cuda")
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if args.print_every and step % args.print_every == 0:
            print(f"step {step} loss: {loss.item():.4f}", flush=True)
        if step == args.hang_at and gpu == 0:
            time.sleep(args.hang_s)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if gpu == 0:
        print(json.dumps({"img_s": args.steps * args.batch_size * ngpus / seconds,
                          "ranks": ngpus}), flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--print-every", type=int, default=10)
    ap.add_argument("--hang-at", type=int, default=-1)
    ap.add_argument("--hang-s", type=float, default=30.0)
    args = ap.parse_args()
    with socket.socket() as s:  # the ImageNet example's fixed port, picked free here
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ngpus = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=ngpus, args=(ngpus, port, args))


if __name__ == "__main__":
    main()
