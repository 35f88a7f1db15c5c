"""Launch -> first step: work started early so that it overlaps the imports of torch and
torchvision (about 6.5 s of one core on the H200 machine). Imports nothing heavy itself.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import threading
from multiprocessing import forkserver

# What a DataLoader worker of a CUDA rank needs loaded before it is forked.
WORKER_PRELOAD = ["torch", "torchvision", "trainer.data"]
# Where the shared libraries a CUDA rank maps live, in the order it needs them: torch's at
# import, the CUDA libraries' (cudnn's engines at the first convolution), torchvision's.
LIBRARY_PACKAGES = ("torch", "nvidia", "torchvision")


def worker_context(cuda: bool):
    """How DataLoader workers start. A rank holding a CUDA context and NCCL maps so much memory
    that each fork() takes seconds (measured on H200: ~5 s a worker, one after another), so CUDA
    ranks start workers from a clean fork server that has torch preloaded; CPU ranks fork."""
    if not cuda:
        return None
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(WORKER_PRELOAD)
    return ctx


def start_worker_server() -> None:
    """Start the fork server now: its preloading runs in its own process while this rank
    imports, instead of after the rank asks for its first batch (8 s later)."""
    worker_context(True)
    forkserver.ensure_running()


def read_ahead_libraries() -> threading.Thread:
    """Ask the kernel to read the CUDA libraries into the page cache, in big sequential reads,
    on a daemon thread: on a cold machine the ranks' imports and first convolution otherwise
    page them in 4 KiB at a time. Cheap when they are cached already."""
    thread = threading.Thread(target=_read_ahead, args=(_library_files(),), daemon=True,
                              name="readahead")
    thread.start()
    return thread


def _library_files() -> list[str]:
    """Package by package, the largest file first."""
    paths = []
    for package in LIBRARY_PACKAGES:
        spec = importlib.util.find_spec(package)  # finds without importing
        found = []
        for root in (spec.submodule_search_locations or []) if spec else []:
            for folder, _, names in os.walk(root):
                found += [os.path.join(folder, n) for n in names if ".so" in n]
        paths += sorted(found, key=os.path.getsize, reverse=True)
    return paths


def _read_ahead(paths: list[str]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
