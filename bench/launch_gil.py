"""Does the rank's start-up overlap? One process, one GPU: how long CUDA's initialisation and a
1-rank NCCL process group take, whether they hold the GIL meanwhile (a ticker thread records
its longest wait), and import torchvision alone, after them, and beside them on a thread.

python bench/launch_gil.py sequential|parallel
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from bench.ticker import Ticker

T0 = time.perf_counter()
marks: dict[str, float] = {}


def mark(name: str) -> None:
    marks[name] = round(time.perf_counter() - T0, 3)


def cuda_and_group() -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    mark("cuda ready")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    dist.barrier()
    mark("process group ready")


def main() -> None:
    mode = sys.argv[1]
    import torch  # noqa: F401

    mark("torch imported")
    ticker = Ticker()
    if mode == "sequential":
        cuda_and_group()
        gap = (ticker.longest, ticker.longest_at - T0)
        import torchvision  # noqa: F401
        mark("torchvision imported")
    else:
        thread = threading.Thread(target=cuda_and_group)
        thread.start()
        import torchvision  # noqa: F401
        mark("torchvision imported")
        thread.join()
        gap = (ticker.longest, ticker.longest_at - T0)
    ticker.stop()
    print(json.dumps({"mode": mode, **marks, "longest_gil_wait_s": round(gap[0], 3),
                      "at_s": round(gap[1], 3)}), flush=True)
    import torch.distributed as dist
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
