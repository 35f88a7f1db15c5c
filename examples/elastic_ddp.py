"""examples/with_ddptui.py made elastic: a rank stopped with s leaves at an agreed step, and one
killed with k (or crashing) is survived: the others re-form, go back to their newest common
rollback point and carry on, without restarting anything.

    ddptui run examples/elastic_ddp.py --cpus 2 -- --epochs 3

What it takes over the three lines: the model from run.ddp(), the data from run.loader(), the
step in `with run.guard():`, and run.elastic() with the state to keep and how to load it.
"""

import torch.distributed as dist
import torch.nn as nn
from plain_ddp import get_args, misbehave, setup

import ddptui


def main() -> None:
    args = get_args()
    run = ddptui.init()
    device, data, sampler, net, opt = setup(args, wrap=run.ddp)  # DDP built for each new world
    run.elastic(lambda: {"model": net.module.state_dict(), "opt": opt.state_dict()},
                lambda state: (net.module.load_state_dict(state["model"]),
                               opt.load_state_dict(state["opt"])))
    loader = run.loader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in run.epochs(args.epochs, sampler):
        misbehave(args, epoch)
        for x, y in loader:
            with run.guard():  # a peer dying in here is survived; the step is redone
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss = loss_fn(net(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                run.step(loss, samples=len(x))
            if run.should_stop:
                break
        if dist.get_rank() == 0:  # the world's rank 0 now: ranks are numbered afresh
            print(f"epoch {epoch} done on {dist.get_world_size()} ranks", flush=True)
    run.done()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
