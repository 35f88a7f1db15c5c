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

from ddptui.contract.environment import cuda_defaults, nccl_defaults
from ddptui.contract.protocol.codec import encode
from ddptui.contract.protocol.events import Notice
from ddptui.contract.rankspec import RankSpec
from ddptui.rank.compat import enable_cuda_sanitizer, leave_forkserver_alive_pipe, run_exit_handlers
from ddptui.rank.elastic.lifeline import die_with_parent, watch_parent
from ddptui.rank.stacks import answer_stacks
from ddptui_trainer.pipeline.forkserver import start_worker_server


def write_bytecode_to_the_cache() -> None:
    """Where ddptui chose a bytecode cache (PYTHONPYCACHEPREFIX set, PYTHONDONTWRITEBYTECODE
    lifted: ddptui/contract/bytecode.py), write to it: multiprocessing starts this process with -B when
    the parent's interpreter had it, and torch would be compiled from source at every start."""
    if sys.pycache_prefix and "PYTHONDONTWRITEBYTECODE" not in os.environ:
        sys.dont_write_bytecode = False


def gpu_environment(spec: RankSpec) -> None:
    """A GPU rank's environment, before CUDA starts."""
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    dp = spec.config.devices.strategy == "dp"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.config.devices.gpus)) if dp \
        else str(spec.physical_gpu)
    # A dead peer is handled by aborting the communicators ourselves (ddptui/rank/elastic/world.py);
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
    answer_stacks(signal.SIGUSR1, open(spec.stacks_path, "a"))
    # A rank that crashes (a heap corruption, a segfault) leaves where each thread was.
    faulthandler.enable(all_threads=True)
    if spec.physical_gpu is not None:
        gpu_environment(spec)
    if spec.rank == 0 and not spec.standby:
        channel.send_bytes(encode(Notice(rank=0, level="info", text="importing torch")).encode())
    import torch

    from ddptui.rank.elastic import world

    sanitize_if_asked()

    forming = None
    if not spec.standby:  # the rest of the imports overlap forming the world
        device = torch.device("cuda", 0) if spec.physical_gpu is not None else torch.device("cpu")
        forming = world.Forming(spec.rank, spec.world_size, device, spec.init_method)
    from ddptui_trainer.rank_main import main

    code = main(spec, channel=channel, inbox=inbox, forming=forming)
    # Everything is closed and flushed (process group, workers, telemetry, logs). Run the exit
    # handlers (multiprocessing's finalizers among them), then skip the interpreter's teardown
    # of torch's heap: it took 1 s of every rank's exit (q, a stop, the end of a run).
    run_exit_handlers()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
