"""What ddptui's telemetry costs a step, measured inside one training process: blocks of steps
alternate between the bare loop and the loop with the rank's real telemetry (StepMeter at
4 Hz writing step events, the NVML/psutil sampler thread at 2 Hz), so clocks, placement and
warm-up are shared and the paired difference is the cost.

torchrun --standalone --nproc-per-node 2 bench/telemetry_cost.py --blocks 20 --steps 100
Rank 0 prints a markdown table and one JSON line. (Differencing whole runs, the method used
before, has run-to-run noise of about 5%: too coarse for a 0.2% target.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

from ddptui.contract.gpu import DeviceSampler
from ddptui.rank.telemetry.reporter import Reporter, StepMeter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=20, help="alternating blocks, half of each kind")
    ap.add_argument("--steps", type=int, default=100, help="steps per block")
    ap.add_argument("--warmup", type=int, default=50)
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank = dist.get_rank()
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.get_model(args.model, num_classes=1000).to(device)
    model = DDP(model.to(memory_format=torch.channels_last), device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    x = torch.randn(args.batch_size, 3, 224, 224, device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (args.batch_size,), device=device)
    log = os.path.join(tempfile.mkdtemp(), f"rank{rank}.jsonl")
    reporter = Reporter(rank, None, log)

    def run(steps: int, meter: StepMeter | None, step0: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if meter is not None:
                meter.step(loss, 0, step0 + i, step0 + i)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    run(args.warmup, None, 0)
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    for block in range(args.blocks):
        kind = "on" if block % 2 else "off"
        meter = sampler = None
        if kind == "on":
            meter = StepMeter(reporter, 4.0, args.batch_size, device)
            sampler = DeviceSampler(reporter.emit, print, local)
            sampler.start()
        seconds[kind].append(run(args.steps, meter, block * args.steps))
        if sampler is not None:
            sampler.stop()
            sampler.join()
    reporter.close()
    if rank == 0:
        pairs = [(on - off) / off for off, on in zip(seconds["off"], seconds["on"], strict=True)]
        cost, err = statistics.mean(pairs), statistics.stdev(pairs) / len(pairs) ** 0.5
        world = dist.get_world_size()
        rate = {k: args.steps * args.batch_size * world / statistics.mean(v)
                for k, v in seconds.items()}
        print("| telemetry | img/s (mean of blocks) | step ms |")
        print("|---|---|---|")
        for kind, label in (("off", "off"), ("on", "on (4 Hz step events + NVML at 2 Hz)")):
            ms = 1000 * statistics.mean(seconds[kind]) / args.steps
            print(f"| {label} | {rate[kind]:,.0f} | {ms:.3f} |")
        print(f"\npaired cost {100 * cost:+.3f}% of a step (standard error {100 * err:.3f}%, "
              f"{len(pairs)} pairs of {args.steps}-step blocks)")
        print(json.dumps({"cost": cost, "stderr": err, "on_img_s": rate["on"],
                          "off_img_s": rate["off"], "blocks": args.blocks}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
