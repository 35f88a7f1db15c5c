"""Checkpoints: the loop's state queued by rank 0 (save), written atomically and announced, and
finding the newest good one to resume from.

The training state is copied to host memory in stream order (the loop does not wait) and a
thread writes it to a temporary name, fsyncs and renames it, so a crash never leaves a torn
checkpoint under a real name; a truncated or foreign file found later is reported and skipped.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ddptui.contract.protocol import events

if TYPE_CHECKING:  # the parts hold the writer: for type checkers only
    from ddptui_trainer.parts import Parts
    from ddptui_trainer.rank import Rank

MAGIC = "ddptui-checkpoint-v1"
NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.pt$")
KEEP = 3  # newest checkpoints of this run kept on disk


def checkpoint_name(epoch: int, steps_done: int) -> str:
    """Named by the position training resumes at: epoch, steps already done in it."""
    return f"ckpt-e{epoch:04d}-s{steps_done:06d}.pt"


def save_checkpoint(directory: str, state: dict) -> str:
    """Write `state` atomically; return the final path."""
    os.makedirs(directory, exist_ok=True)
    sampler = state["sampler"]
    path = os.path.join(directory, checkpoint_name(sampler["epoch"], sampler["steps_done"]))
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"magic": MAGIC, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return path


class Writer:
    """Writes one checkpoint at a time on a thread; `put` returns once the state is copied out
    (queued on the device), `wait` once the last file is durable. A write's error comes back
    from the next `put` or `wait`."""

    def __init__(self, directory: str, done: Callable[[str, dict], None]):
        self.directory = directory
        self.done = done  # called on the writing thread with the path and the state's position
        self.written: list[str] = []  # this run's files, oldest first
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def put(self, state: dict) -> None:
        self.wait()
        copied = _to_host(state)
        ready = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            ready = torch.cuda.Event()
            ready.record()
        self._thread = threading.Thread(target=self._write, args=(copied, ready),
                                        name="checkpoint-writer", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _write(self, state: dict, ready) -> None:
        try:
            if ready is not None:
                ready.synchronize()  # the copies to host memory are done
            path = save_checkpoint(self.directory, state)
            self.written.append(path)
            prune_checkpoints(self.directory, self.written)
            self.done(path, state)
        except BaseException as e:
            self._error = e


def _to_host(value):
    """Tensors copied to (pinned) host memory, queued on the current stream; the rest as is."""
    if torch.is_tensor(value):
        if value.is_cuda:
            return value.detach().to("cpu", non_blocking=True)
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def prune_checkpoints(directory: str, written: list[str]) -> None:
    """Delete this run's older checkpoints beyond the newest KEEP; never touch others' files."""
    for path in written[:-KEEP]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    del written[:-KEEP]


def list_checkpoints(directory: str) -> list[str]:
    """Checkpoint files of `directory`, newest position first."""
    if not os.path.isdir(directory):
        return []
    found = [(tuple(map(int, m.groups())), e.path) for e in os.scandir(directory)
             if (m := NAME.match(e.name))]
    return [path for _, path in sorted(found, reverse=True)]


def load_checkpoint(path: str, model_name: str, optimizer: str = "sgd") -> dict:
    """Load and check one file; raises ValueError saying why it cannot be used."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"unreadable (truncated or not a checkpoint): {type(e).__name__}") from None
    if not isinstance(state, dict) or state.get("magic") != MAGIC:
        raise ValueError("not a ddptui checkpoint")
    if state.get("model_name") != model_name:
        raise ValueError(f"made for model {state.get('model_name')!r}, not {model_name!r}")
    if state.get("optimizer_name", "sgd") != optimizer:
        raise ValueError(f"made with --optimizer {state.get('optimizer_name', 'sgd')}, "
                         f"not {optimizer}")
    return state


def find_resume_state(directory: str, model_name: str, optimizer: str,
                      warn: Callable[[str], None]) -> tuple[str, dict] | None:
    """The newest usable checkpoint in `directory`; unusable ones are reported and skipped."""
    for path in list_checkpoints(directory):
        try:
            return path, load_checkpoint(path, model_name, optimizer)
        except ValueError as e:
            warn(f"skipping checkpoint {path}: {e}")
    return None


def save(p: Parts) -> None:
    """Rank 0 queues a checkpoint of the current position (when a directory is set): the step
    waits for nothing but the previous write; the file is announced once it is durable."""
    if p.checkpoints is None:
        return
    p.checkpoints.put({
        "model_name": p.config.model.name,
        "optimizer_name": p.config.train.optimizer,
        "model": p.model.state_dict(),
        "optimizer": p.optimizer.state_dict(),
        "scheduler": p.scheduler.state_dict(),
        "scaler": p.scaler.state_dict(),
        "sampler": p.sampler.state_dict(),
        "global_step": p.state.global_step,
        "best_val_acc": p.state.best_val_acc,
        "settings": dict(p.state.settings),
        "world_size": p.me.world_size,
    })


def announce_checkpoint(me: Rank, path: str, state: dict) -> None:
    """On the writing thread, once the file is durable."""
    me.reporter.emit(events.Checkpoint(rank=me.reporter.rank, path=path, epoch=state["sampler"]["epoch"],
                     step=state["sampler"]["steps_done"], global_step=state["global_step"]))
