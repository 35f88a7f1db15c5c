"""examples/plain_ddp.py with ddptui's three lines: every rank's own loss and samples/s, epoch
rows, and q, c and space from the dashboard, with no device sync added to the step; and
run.loader(), whose workers and prefetcher follow p, w/W and a.

    ddptui run examples/with_ddptui.py --cpus 2 -- --epochs 3
    torchrun --standalone --nproc-per-node 2 examples/with_ddptui.py   # runs as before

Without ddptui around it, ddptui.init() returns a run whose calls do nothing.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from plain_ddp import get_args, misbehave, setup

import ddptui


def main() -> None:
    args = get_args()
    device, data, sampler, net, opt = setup(args)
    run = ddptui.init()  # 1: report to the dashboard (or to nothing)
    loader = run.loader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers)  # optional: live DataLoader settings
    loss_fn = nn.CrossEntropyLoss()
    for epoch in run.epochs(args.epochs, sampler):  # 2: set_epoch, and a row per epoch
        misbehave(args, epoch)
        correct = 0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            out = net(x)
            loss = loss_fn(out, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            correct += (out.argmax(1) == y).sum()
            run.step(loss, samples=len(x))  # 3: the loss stays on the device, read later
            if run.should_checkpoint:  # c on the dashboard: every rank at the same step
                save(net, epoch)
            if run.should_stop:  # q: every rank leaves the loop at the same step
                break
        run.log(train_acc=(correct / len(sampler)).item())
    run.done()
    dist.destroy_process_group()


def save(net: nn.Module, epoch: int) -> None:
    if dist.get_rank() == 0 and os.environ.get("CHECKPOINT_DIR"):
        path = os.path.join(os.environ["CHECKPOINT_DIR"], f"epoch{epoch}.pt")
        torch.save(net.module.state_dict(), path)
        print(f"saved {path}", flush=True)


if __name__ == "__main__":
    main()
