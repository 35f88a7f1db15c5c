"""The baseline: a hand-written torchrun DDP script with no ddptui code, as a user would write it.

torchrun --standalone --nproc-per-node 2 bench/plain_ddp.py --model resnet18 --steps 300
Synthetic data on the device, bf16 autocast, channels_last, SGD (or fused AdamW); prints one JSON
line (rank 0). --ddptui adds ddptui's three lines (ddptui.init(), run.step(loss, samples=n)), to
measure what they cost (bench/script_overhead.py); --elastic adds run.elastic() on top (the model
from run.ddp(), a rollback point every 50 steps, each step in run.guard()). --loader feeds the
steps from a DataLoader over uint8 images in host memory (a DistributedSampler, pinned memory)
instead of one batch kept on the device; with --ddptui or --elastic, from run.loader().
"""

import argparse
import contextlib
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    ap.add_argument("--ddptui", action="store_true", help="with ddptui.init() and run.step()")
    ap.add_argument("--elastic", action="store_true", help="with run.elastic() too")
    ap.add_argument("--loader", action="store_true", help="batches from a DataLoader")
    ap.add_argument("--samples", type=int, default=8192, help="--loader: images in host memory")
    ap.add_argument("--workers", type=int, default=4, help="--loader: DataLoader workers")
    ap.add_argument("--print-every", type=int, default=0,
                    help="print 'step N loss: X' every N steps (loss.item(): a sync, as "
                    "nanoGPT's log line); 0: never")
    args = ap.parse_args()
    t_launch = float(os.environ.get("BENCH_T0", time.time()))
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.get_model(args.model, num_classes=1000).cuda()
    run, guard = None, contextlib.nullcontext
    if args.ddptui or args.elastic:
        import ddptui

        run = ddptui.init()
    wrap = run.ddp if args.elastic else DDP
    model = wrap(model.to(memory_format=torch.channels_last), device_ids=[local])
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    batches = host_batches(args, run) if args.loader else None
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device="cuda")
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch_size,), device="cuda")
    if args.elastic:
        run.elastic(lambda: {"model": model.module.state_dict(), "opt": opt.state_dict()},
                    lambda state: (model.module.load_state_dict(state["model"]),
                                   opt.load_state_dict(state["opt"])))
        guard = run.guard
    first_step = None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        if batches is not None:
            xb, yb = next(batches)
            x = xb.cuda(non_blocking=True).float().div_(255)
            x, y = x.contiguous(memory_format=torch.channels_last), yb.cuda(non_blocking=True)
        with guard():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if run is not None:
                run.step(loss, samples=args.batch_size)
        if args.print_every and step % args.print_every == 0:
            print(f"step {step} loss: {loss.item():.4f}", flush=True)
        if first_step is None:
            torch.cuda.synchronize()
            first_step = time.time() - t_launch
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        print(json.dumps({"img_s": args.steps * args.batch_size * world / seconds,
                          "first_step_s": first_step, "world": world}), flush=True)
    dist.destroy_process_group()


def host_batches(args: argparse.Namespace, run):
    """Endless batches of uint8 images from host memory, epoch after epoch: a DataLoader as a
    user writes one (pinned memory), or run.loader() with the same arguments."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 256, (args.samples, 3, args.image_size,
                                                args.image_size), dtype=torch.uint8, generator=g),
                         torch.randint(0, 1000, (args.samples,), generator=g))
    sampler = DistributedSampler(data, drop_last=True)
    kw = dict(batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
              pin_memory=True, drop_last=True)
    loader = run.loader(data, **kw) if run is not None else DataLoader(data, **kw)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


if __name__ == "__main__":
    main()
