"""A script that starts its own ranks, in the three shapes of its age: mp.spawn with a tcp://
init_method (the PyTorch ImageNet example), start_processes(fork) with env:// (Keras's guide),
multiprocessing.Process. Flags make rank 1 hang, raise, or print a flood of lines; --nodes and
--node-rank make it HRNet's multi-node form (each node's launcher spawns its --nprocs ranks)."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main_worker(local: int, args) -> None:
    rank, world = args.node_rank * args.nprocs + local, args.nodes * args.nprocs
    if args.shape == "fork":  # the Keras guide sets torchrun's variables itself
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port),
                          RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("gloo", init_method="env://")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                world_size=world, rank=rank)
    run = None
    if args.init:
        import ddptui

        run = ddptui.init()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        for step in range(args.steps):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if run is not None:
                run.step(loss, samples=8)
            else:
                print(f"epoch {epoch} step {step} loss: {loss.item():.4f}", flush=True)
            if rank == 1 and args.hang and epoch == 0 and step == 2:
                busy_in_my_own_code(args.hang)
            if rank == 1 and args.fail and epoch == 0 and step == 2:
                raise ValueError("rank 1 broke on purpose")
            time.sleep(args.sleep)
    for i in range(args.lines):
        print(f"rank {rank} line {i} " + "x" * 40)
    dist.barrier()
    dist.destroy_process_group()


def busy_in_my_own_code(seconds: float) -> None:
    until = time.time() + seconds
    while time.time() < until:
        time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", choices=["spawn", "fork", "process"], default="spawn")
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--port", type=int, default=23456)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--sleep", type=float, default=0.05)
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--hang", type=float, default=0.0)
    p.add_argument("--fail", action="store_true")
    p.add_argument("--init", action="store_true")
    args = p.parse_args()
    print(f"launcher: starting {args.nprocs} ranks ({args.shape})", flush=True)
    if args.shape == "spawn":
        mp.spawn(main_worker, nprocs=args.nprocs, args=(args,))
    elif args.shape == "fork":
        mp.start_processes(main_worker, nprocs=args.nprocs, args=(args,), start_method="fork")
    else:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=main_worker, args=(r, args)) for r in range(args.nprocs)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        sys.exit(max(proc.exitcode for proc in procs) and 1)


if __name__ == "__main__":
    main()
