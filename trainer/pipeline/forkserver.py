"""The fork server that DataLoader workers of CUDA ranks start from, started before the rank
imports torch so that the server's own imports overlap the rank's. Imports nothing heavy itself.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing import forkserver as mp_forkserver

from ddptui.contract.environment import RANK_ONLY_VARIABLES

# What a DataLoader worker of a CUDA rank needs loaded before it is forked.
WORKER_PRELOAD = ["torch", "torchvision", "ddptui_trainer.pipeline.datasets"]


def worker_context(cuda: bool):
    """How DataLoader workers start. A rank holding a CUDA context and NCCL maps so much memory
    that each fork() takes seconds, one worker after another (docs/benchmarks.md, the input
    pipeline), so CUDA ranks start workers from a clean fork server that has torch preloaded;
    CPU ranks fork, explicitly: a rank's default may be spawn, a fresh interpreter importing
    torch for each worker."""
    if not cuda:
        return mp.get_context("fork")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(WORKER_PRELOAD)
    return ctx


def start_worker_server() -> None:
    """Start the fork server now, before the rank has threads (its environment is changed for
    the start): its preloading runs in its own process while this rank imports, instead of
    after the rank asks for its first batch (8 s later)."""
    worker_context(True)
    _ensure_server()


def _ensure_server() -> None:
    """The server starts without what makes torch's import start CUDA (the sanitizer, seen on
    an H100: every worker forked from a server that had it failed "Cannot re-initialize CUDA in
    forked subprocess"); it keeps the environment it started with, and so do its workers."""
    hidden = {name: os.environ.pop(name) for name in RANK_ONLY_VARIABLES if name in os.environ}
    try:
        mp_forkserver.ensure_running()
    finally:
        os.environ.update(hidden)
