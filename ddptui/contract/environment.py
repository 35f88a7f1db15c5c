"""The environment ddptui's ranks start with, set by whoever starts them: NCCL's and CUDA's
defaults unless the user chose otherwise, and what only ranks may see.
"""

from __future__ import annotations

import os

# ddptui's sitecustomize: put first on a rank's PYTHONPATH (its stacks on a signal, its end with
# ddptui's, a launcher's ranks shown as they join)
INJECT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "inject")


def with_inject(pythonpath: str | None) -> str:
    """PYTHONPATH with ddptui's sitecustomize first."""
    return os.pathsep.join(p for p in (INJECT, pythonpath or "") if p)


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
# out those 60 s. ~1 s here (docs/benchmarks.md, recovery).
NCCL_CONNECT_RETRIES = {"NCCL_SOCKET_RETRY_CNT": "6", "NCCL_SOCKET_RETRY_SLEEP_MSEC": "50"}


# How long a non-blocking communicator's set-up waits for its members (torch's default: 30
# minutes; torch reads it once, at a process's first such wait): a survivor forming a world with
# a member that died in it goes on without it after this, where the recover order's shutting of
# NCCL's listening sockets did not end the wait first (ddptui/rank/elastic/sockets.py). Every world
# ddptui forms is non-blocking, and a script's joiner's; a script's own communicators are not.
NCCL_SETUP_TIMEOUT = {"TORCH_NCCL_NONBLOCKING_TIMEOUT": "5"}


# The built-in loop's worlds are abortable once formed only if NCCL made every connection at
# init (a peer dead before a collective's connections were made left the survivor waiting in
# torch for ever, abort or not: bench/nccl_abort.py); no abort reaches a set-up (above).
# Costs ~0.5 GiB of GPU memory per communicator.
# NCCL's cuMem buffers pass their handles to peers over Unix sockets at init, and a survivor
# whose request went to a joiner that died before answering waits out the set-up timeout; CUDA
# IPC handles go over TCP, where the dead peer's closed connection fails the set-up at once,
# at no cost in speed (docs/benchmarks.md). NVLink SHARP (NVSwitch machines) needs cuMem, so
# NCCL_CUMEM_ENABLE=1 keeps it.
NCCL_ABORTABLE = {"NCCL_RUNTIME_CONNECT": "0", "NCCL_CUMEM_ENABLE": "0", **NCCL_SETUP_TIMEOUT}


def nccl_defaults(env: dict, abortable: bool = False) -> None:
    """What ddptui's ranks on one machine start with unless the user chose otherwise: the set-up
    timeout holds for non-blocking communicators only (those of the worlds ddptui forms, and a
    script's joiner's), so a script's own keep NCCL's defaults; `abortable`: the built-in
    loop's worlds connect at init."""
    for name, value in {**NCCL_CONNECT_RETRIES, **NCCL_SETUP_TIMEOUT,
                        **(NCCL_ABORTABLE if abortable else {})}.items():
        env.setdefault(name, value)


# What makes torch's import start CUDA: the fork server ranks come from must not see it (a rank
# forked from a process that started CUDA cannot use it), so the rank does what the import would.
RANK_ONLY_VARIABLES = ("TORCH_CUDA_SANITIZER",)
