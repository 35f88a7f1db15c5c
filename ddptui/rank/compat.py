"""The private APIs of torch and of Python's standard library that ddptui relies on, each with
the versions it was checked against: when an upgrade breaks one, it breaks here.

Checked against torch 2.11 (CUDA) and 2.14 (CPU), CPython 3.11 and 3.12. torch is imported
inside the functions: ddptui's parent process uses this module without it.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta
from multiprocessing import forkserver


def abort_process_group() -> None:
    """Abort the default group's communicators (torch.distributed.distributed_c10d's
    `_abort_process_group`): collectives waiting on a dead peer return. Public in no release."""
    import torch.distributed as dist

    dist.distributed_c10d._abort_process_group()


def set_group_timeout(timeout: timedelta, group) -> None:
    """`dist.set_timeout` where torch has it, else `distributed_c10d._set_pg_timeout` (torch
    2.11 and 2.14 have only the private one)."""
    import torch.distributed as dist

    (getattr(dist, "set_timeout", None) or dist.distributed_c10d._set_pg_timeout)(timeout, group)


def default_group():
    """The default process group object (`distributed_c10d._get_default_group`), or None."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_group() if dist.is_initialized() else None


def default_store():
    """The default process group's store (`distributed_c10d._get_default_store`)."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def scaler_tensors(scaler) -> list:
    """A GradScaler's state as tensors: its `_scale` and `_growth_tracker`, which exist once it
    has been used or its scale asked for (state_dict() turns them into Python numbers)."""
    return [scaler._scale, scaler._growth_tracker]


def tree_flatten(obj):
    """(leaves, spec) of nested containers (`torch.utils._pytree`: dicts, lists, tuples, named
    tuples, OrderedDicts); the spec pickles, for a joining rank."""
    from torch.utils import _pytree

    return _pytree.tree_flatten(obj)


def tree_unflatten(leaves: list, spec):
    from torch.utils import _pytree

    return _pytree.tree_unflatten(leaves, spec)


def enable_cuda_sanitizer() -> None:
    """PyTorch's CUDA sanitizer (`torch.cuda._sanitizer`), as TORCH_CUDA_SANITIZER=1 turns it on
    at torch's import."""
    import torch.cuda._sanitizer as csan

    if not csan.cuda_sanitizer.enabled:
        csan.enable_cuda_sanitizer()


def run_exit_handlers() -> None:
    """Run the atexit handlers now (`atexit._run_exitfuncs`), before an os._exit()."""
    atexit._run_exitfuncs()


def leave_forkserver_alive_pipe() -> None:
    """In a child forked from the fork server: close its copy of the pipe whose end tells the
    server that its clients are gone (`forkserver._forkserver._forkserver_alive_fd`)."""
    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        server._forkserver_alive_fd = None
