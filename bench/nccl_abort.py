"""What torch's abort of a non-blocking NCCL world can end, on 2 GPUs: the facts world.py's
forming of worlds rests on, each case in fresh processes, one JSON line per case.

python bench/nccl_abort.py            # every case
python bench/nccl_abort.py init_dead  # one
Cases (rank 1 is the peer that dies; rank 0 reports):
  ready       both live: how long until backend._is_initialized() says the eager, non-blocking
              communicator is made, without a collective; the GPU memory it took
  init_dead   rank 1 never comes: rank 0's first all-reduce (on a thread) waits for the
              communicator, and is aborted (from another thread) 1 s later; then a world of 1
  first_dead  rank 1 dies 2 s after its communicator was made, before the first collective:
              rank 0's first all-reduce, aborted the same way
  *_cut       the same, but NCCL's sockets (those made since the store) are shut down instead
              of the abort; the abort follows once the collective has ended
  *_timeout   init_dead, and rank 1 killed 0.1 s into its init (init_killed), with
              TORCH_NCCL_NONBLOCKING_TIMEOUT=5 and no abort while rank 0 waits: its first
              all-reduce, on the main thread, must fail by itself; then the abort, from the
              same thread, as ddptui's ranks do it (ddptui/rank/elastic/world.py)
  *_listeners the *_timeout cases, but 1 s in another thread shuts the listening sockets made
              since the store that no event loop watches, as a recover order does
              (ddptui/rank/elastic/sockets.py shut_listeners)
Each case also with NCCL_RUNTIME_CONNECT=0 (connections made at init instead of first use).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ddptui.rank.elastic.sockets import open_sockets, shut_listeners, tcp_sockets  # noqa: E402

CASES = ("ready", "init_dead", "first_dead", "init_dead_cut", "first_dead_cut",
         "init_dead_timeout", "init_killed_timeout", "init_dead_listeners",
         "init_killed_listeners")
LIMIT_S = 40  # a case still running then is reported hung


def rank_main(case: str, rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    report: dict = {"case": case, "runtime_connect": os.environ.get("NCCL_RUNTIME_CONNECT", "1")}
    if case.startswith("init_dead") and rank == 1:
        os._exit(0)
    before = open_sockets()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                          timeout=timedelta(seconds=30), wait_for_workers=False)
    opts = dist.ProcessGroupNCCL.Options()
    opts.config.blocking = 0
    free0 = torch.cuda.mem_get_info(dev)[0]
    t0 = time.perf_counter()
    dist.init_process_group("nccl", store=store, rank=rank, world_size=2, device_id=dev,
                            pg_options=opts)
    backend = dist.distributed_c10d._get_default_group()._get_backend(dev)
    report["init_returned_s"] = round(time.perf_counter() - t0, 3)
    if case.startswith("init_killed") and rank == 1:
        time.sleep(0.1)
        os._exit(0)
    deadline = time.perf_counter() + (2 if rank == 1 or case == "ready" else 0)
    while not backend._is_initialized() and time.perf_counter() < deadline:
        time.sleep(0.001)
    report["initialized"] = backend._is_initialized()
    report["initialized_s"] = round(time.perf_counter() - t0, 3)
    report["comm_mib"] = round((free0 - torch.cuda.mem_get_info(dev)[0]) / 2**20)
    if case.startswith("first_dead") and rank == 1:
        os._exit(0)
    if case == "ready":
        dist.barrier()
    if case.startswith("first_dead"):
        time.sleep(2.5)
    if case != "ready":
        if case.endswith("_timeout"):
            report.update(fail_by_itself(dist, torch, dev))
        elif case.endswith("_listeners"):
            report.update(fail_by_itself(dist, torch, dev, lambda: shut_listeners(
                open_sockets() - before, keep_port=port)))
        else:
            cut = (lambda: shut(open_sockets() - before, port)) if case.endswith("_cut") else None
            report.update(first_collective(dist, torch, dev, cut))
        if report["collective"] == "stuck":  # the process cannot go on: report as it is
            with open(out, "w") as f:
                json.dump(report, f)
            os._exit(0)
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=dev, pg_options=opts)
        x = torch.ones(1, device=dev)
        dist.all_reduce(x)
        report["world_of_1"] = float(x.item())
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    os._exit(0)


def shut(sockets, store_port: int) -> int:
    """Shut down each TCP socket (listening ones too) but the store's; how many."""
    n = 0
    for s in tcp_sockets(sockets):
        try:
            if store_port not in (s.getsockname()[1], _peer_port(s)):
                s.shutdown(socket.SHUT_RDWR)
                n += 1
        except OSError:
            pass
    return n


def _peer_port(s) -> int | None:
    try:
        return s.getpeername()[1]
    except OSError:
        return None


def first_collective(dist, torch, dev, cut=None) -> dict:
    """Rank 0's first all-reduce on a thread, aborted from this one 1 s after rank 1 is gone:
    whether the abort returns, whether the collective ends, and the CPU the process burns
    in the 2 s after the abort (a thread spinning in torch's wait burns 2 s)."""
    box: dict = {"collective": "stuck"}

    def collect() -> None:
        try:
            dist.all_reduce(torch.ones(1 << 20, device=dev))
            torch.cuda.synchronize()
            box["collective"] = "completed"
        except Exception as e:
            box["collective"] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"

    worker = threading.Thread(target=collect, daemon=True)
    worker.start()
    time.sleep(1)
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = {}
    if cut is not None:
        result["cut"] = cut()
        worker.join(10)
        result["ended_s"] = round(time.perf_counter() - t0, 3)
    aborter = threading.Thread(target=dist.distributed_c10d._abort_process_group, daemon=True)
    aborter.start()
    aborter.join(5)
    result.update(abort="returned" if not aborter.is_alive() else "blocked",
                  abort_s=round(time.perf_counter() - t0, 3))
    worker.join(2)
    time.sleep(max(0.0, 2 - (time.perf_counter() - t0)))
    result["cpu_s_after_abort"] = round(time.process_time() - cpu0, 2)
    return {**box, **result}


def fail_by_itself(dist, torch, dev, cut=None) -> dict:
    """Rank 0's first all-reduce on this thread, left to end by itself (or by `cut`, called
    from another thread 1 s in), then the abort."""
    cuts: list = []
    if cut is not None:
        threading.Timer(1.0, lambda: cuts.append(cut())).start()
    t0 = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(1 << 20, device=dev))
        torch.cuda.synchronize()
        result = {"collective": "completed"}
    except Exception as e:
        result = {"collective": f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"}
    result["ended_s"] = round(time.perf_counter() - t0, 3)
    if cuts:
        result["cut"] = cuts[0]
    t0 = time.perf_counter()
    dist.distributed_c10d._abort_process_group()
    result.update(abort="returned", abort_s=round(time.perf_counter() - t0, 3))
    return result


def run_case(case: str, runtime_connect: str, port: int) -> dict:
    import subprocess

    out = f"/tmp/nccl_abort_{case}_{runtime_connect}.json"
    if os.path.exists(out):
        os.remove(out)
    env = {**os.environ, "NCCL_RUNTIME_CONNECT": runtime_connect,
           "NCCL_SOCKET_RETRY_CNT": "12", "NCCL_SOCKET_RETRY_SLEEP_MSEC": "50",
           **({"TORCH_NCCL_NONBLOCKING_TIMEOUT": "5"}
              if case.endswith(("_timeout", "_listeners")) else {})}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", case, str(r), str(port), out],
                              env=env) for r in (0, 1)]
    start = time.perf_counter()
    while procs[0].poll() is None and time.perf_counter() - start < LIMIT_S:
        time.sleep(0.1)
    hung = procs[0].poll() is None
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    result = json.load(open(out)) if os.path.exists(out) else {"case": case}
    result.update(runtime_connect=runtime_connect, hung=hung, exit=procs[0].returncode)
    return result


def main() -> int:
    if sys.argv[1:2] == ["--rank"]:  # one of a case's two processes
        case, rank, port, out = sys.argv[2:6]
        rank_main(case, int(rank), int(port), out)
        return 0
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", metavar="CASE",
                   help=f"the cases to run, of {', '.join(CASES)} (default: every one)")
    args = p.parse_args()
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        p.error(f"unknown case {', '.join(unknown)} (of {', '.join(CASES)})")
    port = 29611
    for case in args.cases or CASES:
        for rc in ("1", "0"):
            port += 1
            print(json.dumps(run_case(case, rc, port)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
