"""Checkpoints: atomic writes by rank 0, and finding the newest good one to resume from.

A file is written to a temporary name, fsynced and renamed, so a crash never leaves a torn
checkpoint under a real name; a truncated or foreign file found later is reported and skipped.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable

import torch

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


def load_checkpoint(path: str, model_name: str) -> dict:
    """Load and check one file; raises ValueError saying why it cannot be used."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(f"unreadable (truncated or not a checkpoint): {type(e).__name__}") from None
    if not isinstance(state, dict) or state.get("magic") != MAGIC:
        raise ValueError("not a ddptui checkpoint")
    if state.get("model_name") != model_name:
        raise ValueError(f"made for model {state.get('model_name')!r}, not {model_name!r}")
    return state


def find_resume_state(directory: str, model_name: str,
                      warn: Callable[[str], None]) -> tuple[str, dict] | None:
    """The newest usable checkpoint in `directory`; unusable ones are reported and skipped."""
    for path in list_checkpoints(directory):
        try:
            return path, load_checkpoint(path, model_name)
        except ValueError as e:
            warn(f"skipping checkpoint {path}: {e}")
    return None
