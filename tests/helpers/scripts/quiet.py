"""A torchrun script that prints on rank 0 alone once it trains, as timm's and mmengine's do
(every rank says one line as it starts), training a model with BatchNorm (DDP broadcasts its
buffers at every forward).

    --seconds S          train for S seconds (steps paced by --step-seconds), then end
    --asleep-rank N      rank N sleeps before its forward at step 5, in asleep_here()
    --end-unhandled      rank 0 then lingers 6 s with faulthandler's handlers gone, as a
                         rank's ending interpreter has them (Python's finalization
                         unregisters them), and exits 0
    --cuda               NCCL, the model on the rank's GPU (LOCAL_RANK)
    --silent             no line at all, on any rank, until the end
"""

import argparse
import faulthandler
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def asleep_here() -> None:
    time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--step-seconds", type=float, default=0.05)
    p.add_argument("--asleep-rank", type=int, default=None)
    p.add_argument("--end-unhandled", action="store_true")
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--silent", action="store_true")
    args = p.parse_args()
    dist.init_process_group("nccl" if args.cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.cuda else \
        torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    if not args.silent:
        print(f"process {rank}, total {dist.get_world_size()}, device {device}", flush=True)
    torch.manual_seed(0)
    net = DDP(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                            nn.Linear(16, 2)).to(device))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(16, 8, device=device), torch.randint(0, 2, (16,), device=device)
    step, start = 0, time.time()
    while time.time() - start < args.seconds:
        if rank == args.asleep_rank and step == 5:
            asleep_here()
        loss = nn.functional.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0 and not args.silent:
            print(f"step {step} loss: {loss.item():.4f}", flush=True)
        step += 1
        time.sleep(args.step_seconds)
    dist.destroy_process_group()
    if rank == 0:
        print(f"trained {step} steps", flush=True)
    if rank == 0 and args.end_unhandled:
        faulthandler.unregister(signal.SIGUSR1)
        time.sleep(6)


if __name__ == "__main__":
    main()
