"""Where launch -> first step goes in a plain torchrun DDP script: one timestamp per phase.

BENCH_T0=$(date +%s.%N) torchrun --standalone --nproc-per-node 2 bench/launch_phases.py [--no-benchmark]
Rank 0 prints one JSON line: seconds since BENCH_T0 at the end of each phase.
"""

import os
import sys
import time

T0 = float(os.environ.get("BENCH_T0", time.time()))
marks = {"python": time.time() - T0}


def mark(name: str) -> None:
    marks[name] = round(time.time() - T0, 3)


import torch  # noqa: E402

mark("import torch")
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchvision  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

mark("import torchvision")


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.backends.cudnn.benchmark = "--no-benchmark" not in sys.argv
    torch.cuda.set_device(local)
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    mark("cuda context")
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    mark("init_process_group")
    model = torchvision.models.resnet18(num_classes=1000)
    mark("model on cpu")
    model = model.cuda().to(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    mark("model on gpu")
    model = DDP(model, device_ids=[local])
    torch.cuda.synchronize()
    mark("ddp wrap")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(256, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")
    for i in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(x)
            loss = F.cross_entropy(out, y)
        torch.cuda.synchronize()
        mark(f"forward {i}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        mark(f"step {i}")
    if dist.get_rank() == 0:
        import json
        print(json.dumps(marks), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
