"""In a rank that `ddptui run` started with torchrun's variables: a script that starts ranks of its
own from inside a library (Lightning's ddp_spawn, accelerate's launcher, detectron2's launch(),
any torch.multiprocessing.start_processes or torch.distributed's elastic launch), which reading
the script could not find, is seen as it does so. The rank tells the run and waits there; the run
starts the script again, once, as their launcher, with none of torchrun's variables (with them,
the library takes each copy for a rank of a job of its own, and the copies' ranks collide).

Loaded by ddptui's sitecustomize; the standard library alone until the script imports torch.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
import traceback

from ddptui.contract.protocol.codec import dumps
from ddptui.rank.patching import after_import

DOOR = "DDPTUI_RELAUNCH"  # the run's rank socket, in a rank whose run may start it again


def guard() -> None:
    """From the rank's start: the launching calls, once torch's modules that have them load."""
    rank = os.getpid()  # a process the rank forks keeps the guard but is not the rank

    def patch_mp(module) -> None:
        # The package's `spawn` is the function; the module of that name is in sys.modules.
        for owner in (module, sys.modules["torch.multiprocessing.spawn"]):
            for name in ("start_processes", "spawn"):
                setattr(owner, name, _guarded(getattr(owner, name),
                                              f"torch.multiprocessing.{name}", rank))

    def patch_elastic(module) -> None:
        module.launch_agent = _guarded(module.launch_agent, "torch.distributed's elastic launch",
                                       rank)

    after_import({"torch.multiprocessing": patch_mp,
                  "torch.distributed.launcher.api": patch_elastic})


def _guarded(original, name: str, rank: int):
    @functools.wraps(original)
    def guarded(*args, **kwargs):
        if os.getpid() == rank and _told(f"{name}, called from {_caller()}"):
            while True:  # the run ends this process and starts the script again
                time.sleep(60)
        return original(*args, **kwargs)

    return guarded


def _told(how: str) -> bool:
    """Whether the run heard it (else the script goes on as without ddptui)."""
    path = os.environ.get(DOOR)
    if not path:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5.0)
            s.connect(path)
            s.sendall((dumps({"launches": os.getpid(), "how": how[:300]}) + "\n").encode())
            return s.recv(1) == b"+"  # the run's answer: it starts the script again
    except OSError:
        return False


def _caller() -> str:
    """The innermost frame outside torch that made the call: 'lightning/pytorch/strategies/
    launchers/multiprocessing.py:144', or the script's own file and line."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or frame.filename == __file__:
            continue
        for mark in ("/site-packages/", "/dist-packages/"):
            if mark in path:
                return f"{path.rpartition(mark)[2]}:{frame.lineno}"
        return f"{os.path.basename(path)}:{frame.lineno}"
    return "torch"
