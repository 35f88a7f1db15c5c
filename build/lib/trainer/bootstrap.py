"""The first code a rank started by ddptui runs: it takes the supervisor's environment, ties the
rank's life to ddptui, pins its GPU, silences the terminal and starts its workers' fork server,
all before CUDA starts; then it forms the world on a thread while whatever its fork server did
not import imports, and hands over to rank_main.main.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from dataclasses import dataclass

from ddptui.contract.events import event
from ddptui.kit.compat import enable_cuda_sanitizer, leave_forkserver_alive_pipe, run_exit_handlers
from ddptui.kit.elastic.lifeline import die_with_parent, watch_parent
from trainer.config import RunConfig
from trainer.pipeline.forkserver import start_worker_server


@dataclass(frozen=True)
class RankSpec:
    """What the supervisor tells one rank process."""

    config: RunConfig
    slot: int  # the rank's name for the whole run
    rank: int  # its rank in the world it starts in (a standby's is assigned when it joins)
    world_size: int
    init_method: str
    physical_gpu: int | None
    parent_pid: int
    output_path: str  # the rank's stdout/stderr: tracebacks land here, not on the dashboard
    stacks_path: str  # where SIGUSR1 makes faulthandler write every thread's Python stack
    standby: bool = False  # warm up, then wait for the supervisor's join order
    environ: dict[str, str] | None = None  # the supervisor's, as the rank is started


def write_bytecode_to_the_cache() -> None:
    """Where ddptui chose a bytecode cache (PYTHONPYCACHEPREFIX set, PYTHONDONTWRITEBYTECODE
    lifted: ddptui/bytecode.py), write to it: multiprocessing starts this process with -B when
    the parent's interpreter had it, and torch would be compiled from source at every start."""
    if sys.pycache_prefix and "PYTHONDONTWRITEBYTECODE" not in os.environ:
        sys.dont_write_bytecode = False


def cuda_defaults() -> None:
    """Before CUDA starts, unless the user chose otherwise: one hardware queue per stream (CUDA
    maps streams onto 8 queues by default, so the decode or prefetch stream can share one with
    the training stream and wait behind its kernels), and a caching allocator that grows its
    segments instead of keeping blocks of every size (less GPU memory, no slower).
    docs/benchmarks.md, the input pipeline, has the figures of both."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    if not (os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF")):
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


# NCCL retries a refused connection for about 60 s (34 tries, each waiting 100 ms longer). On
# one machine a refusal means the peer died (its listening socket was there before anyone knew
# its address), and a survivor forming a world with a rank that died inside NCCL's set-up sat
# out those 60 s. ~1 s here (docs/benchmarks.md, ranks killed at any moment).
NCCL_CONNECT_RETRIES = {"NCCL_SOCKET_RETRY_CNT": "6", "NCCL_SOCKET_RETRY_SLEEP_MSEC": "50"}


# How long a non-blocking communicator's set-up waits for its members (torch's default: 30
# minutes; torch reads it once, at a process's first such wait): a survivor forming a world with
# a member that died in it goes on without it after this, where the recover order's shutting of
# NCCL's listening sockets did not end the wait first (ddptui/kit/elastic/sockets.py). Every world
# ddptui forms is non-blocking, and a script's joiner's; a script's own communicators are not.
NCCL_SETUP_TIMEOUT = {"TORCH_NCCL_NONBLOCKING_TIMEOUT": "5"}


# The built-in loop's worlds are abortable once formed only if NCCL made every connection at
# init (a peer dead before a collective's connections were made left the survivor waiting in
# torch for ever, abort or not: bench/nccl_abort.py); no abort reaches a set-up (above).
# Costs ~0.5 GiB of GPU memory per communicator.
# NCCL's cuMem buffers pass their handles to peers over Unix sockets at init: a survivor whose
# request went to a joiner that died before answering waited out the set-up timeout (7 of 12
# kills 0.35-0.5 s into a join, 6.3 s each); with CUDA IPC handles, which go over TCP, the
# dead peer's closed connection fails the set-up at once (12 of 12: 0.7-1.6 s). All-reduce
# bandwidth and images/s were the same on 2 x H100; NVLink SHARP (NVSwitch machines) needs
# cuMem, so NCCL_CUMEM_ENABLE=1 keeps it (docs/benchmarks.md).
NCCL_ABORTABLE = {"NCCL_RUNTIME_CONNECT": "0", "NCCL_CUMEM_ENABLE": "0", **NCCL_SETUP_TIMEOUT}


def nccl_defaults(env: dict, abortable: bool = False) -> None:
    """What ddptui's ranks on one machine start with unless the user chose otherwise: the set-up
    timeout holds for non-blocking communicators only (those of the worlds ddptui forms, and a
    script's joiner's), so a script's own keep NCCL's defaults; `abortable`: the built-in
    loop's worlds connect at init."""
    for name, value in {**NCCL_CONNECT_RETRIES, **NCCL_SETUP_TIMEOUT,
                        **(NCCL_ABORTABLE if abortable else {})}.items():
        env.setdefault(name, value)


def gpu_environment(spec: RankSpec) -> None:
    """A GPU rank's environment, before CUDA starts."""
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    dp = spec.config.devices.strategy == "dp"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.config.devices.gpus)) if dp \
        else str(spec.physical_gpu)
    # A dead peer is handled by aborting the communicators ourselves (ddptui/kit/elastic/world.py);
    # NCCL's watchdog must not tear the process down first.
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"
    nccl_defaults(os.environ, abortable=True)
    cuda_defaults()
    if spec.config.data.kind != "synthetic" and spec.config.data.resolved_workers(spec.world_size):
        start_worker_server()


def leave_the_fork_server() -> None:
    """A rank forked from the server dies with it (the server ends with the supervisor), and does
    not keep it alive: every child holds the pipe whose end tells the server its clients are gone."""
    die_with_parent()
    leave_forkserver_alive_pipe()


# What makes torch's import start CUDA: the fork server ranks come from must not see it (a rank
# forked from a process that started CUDA cannot use it), so the rank does what the import would.
RANK_ONLY_VARIABLES = ("TORCH_CUDA_SANITIZER",)


def sanitize_if_asked() -> None:
    """PyTorch's CUDA sanitizer where TORCH_CUDA_SANITIZER asks for it, as importing torch in a
    fresh process would have turned it on."""
    if "TORCH_CUDA_SANITIZER" in os.environ:
        enable_cuda_sanitizer()


def run_rank(spec: RankSpec, channel, inbox) -> None:
    """multiprocessing target; the exit code is rank_main.main's."""
    if spec.environ is not None:  # forked from a server started earlier: the environment now
        os.environ.clear()
        os.environ.update(spec.environ)
    write_bytecode_to_the_cache()
    leave_the_fork_server()
    watch_parent(spec.parent_pid)
    # The supervisor orders every shutdown; a terminal Ctrl-C reaches the whole process group,
    # and a rank interrupted mid-collective would leave the others hanging.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(spec.output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # The supervisor asks a stalled rank where it is stuck; faulthandler answers from C, so it
    # works even while the main thread holds the GIL in a call that never returns. Appending:
    # the supervisor empties the file before each request.
    faulthandler.register(signal.SIGUSR1, file=open(spec.stacks_path, "a"), all_threads=True)
    # A rank that crashes (a heap corruption, a segfault) leaves where each thread was.
    faulthandler.enable(all_threads=True)
    if spec.physical_gpu is not None:
        gpu_environment(spec)
    if spec.rank == 0 and not spec.standby:
        channel.send(event("message", 0, level="info", text="importing torch"))
    import torch

    from ddptui.kit.elastic import world

    sanitize_if_asked()

    forming = None
    if not spec.standby:  # the rest of the imports overlap forming the world
        device = torch.device("cuda", 0) if spec.physical_gpu is not None else torch.device("cpu")
        forming = world.Forming(spec.rank, spec.world_size, device, spec.init_method)
    from trainer.rank_main import main

    code = main(spec.config, spec.rank, spec.world_size, init_method=spec.init_method,
                channel=channel, inbox=inbox, physical_gpu=spec.physical_gpu, slot=spec.slot,
                standby=spec.standby, forming=forming)
    # Everything is closed and flushed (process group, workers, telemetry, logs). Run the exit
    # handlers (multiprocessing's finalizers among them), then skip the interpreter's teardown
    # of torch's heap: it took 1 s of every rank's exit (q, a stop, the end of a run).
    run_exit_handlers()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
