"""run.elastic()'s rollback points: what your state function returns, its tensors copied out
every few steps (on a side stream on GPUs) beside its other values, and given back after a death.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ddptui.contract.protocol.orders import Order
from ddptui.rank.compat import tree_flatten, tree_unflatten
from ddptui.rank.elastic.snapshot import Snapshots


class Slot:
    """Where a tensor was in your state (an index into the points' tensors)."""

    def __init__(self, index: int):
        self.index = index


class Rollback:
    """The points of state_fn()'s state; load_fn gets one back. Your model's buffers come first
    among the tensors: a forward writes them, so it waits only for their copy."""

    def __init__(self, state_fn: Callable[[], Any], load_fn: Callable[[Any], None],
                 module: torch.nn.Module, cuda: bool):
        self.state_fn, self.load_fn, self.module, self.cuda = state_fn, load_fn, module, cuda
        self.points: Snapshots | None = None
        self._hook = register_optimizer_step_pre_hook(self._before_update)

    def take(self, step: int, host: dict, agreed: bool = False) -> None:
        """A point after `step`, the run's position (`host`) kept beside it."""
        tensors, skeleton, buffers = self.read()
        if self.points is None or not _alike(self.points.live, tensors):
            self.points = Snapshots(tensors, self.cuda, buffers)  # e.g. the optimizer's first step
        self.points.live = tensors
        self.points.take(step, {**host, "yours": skeleton}, agreed)

    def read(self) -> tuple[list[torch.Tensor], Any, int]:
        """state_fn()'s tensors (the buffers first), its structure with each tensor's Slot in its
        place and the other values copied, and how many tensors are buffers."""
        leaves, spec = tree_flatten(self.state_fn())
        written = {b.data_ptr() for b in self.module.buffers()}
        found = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        first = [i for i in found if leaves[i].data_ptr() in written]
        order = first + [i for i in found if leaves[i].data_ptr() not in written]
        slots = {i: Slot(n) for n, i in enumerate(order)}
        skeleton = [slots[i] if i in slots else copy.deepcopy(v) for i, v in enumerate(leaves)]
        return [leaves[i].detach() for i in order], (skeleton, spec), len(first)

    def load(self, skeleton: Any, tensors: list[torch.Tensor]) -> None:
        """load_fn() with the state whose structure read() returned, holding `tensors`."""
        leaves, spec = skeleton
        self.load_fn(tree_unflatten([tensors[v.index] if isinstance(v, Slot) else v
                                     for v in leaves], spec))

    def restore(self, step: int) -> dict:
        """The point after `step` given back to load_fn; its run position returned."""
        host = self.points.restore(step)
        self.load(host["yours"], self.points.live)
        return host

    def at(self, step: int) -> bool:
        """Whether the newest point is after `step`: nothing trained since it."""
        return self.points is not None and self.points.newest.step == step

    def summary(self) -> dict:
        return self.points.summary() if self.points else {"held": [], "confirmed": -1}

    def step_done(self, step: int) -> None:
        if self.points is not None:
            self.points.step_done(step)

    def on_urgent(self, order: Order) -> None:
        """On the mailbox thread, as soon as ddptui says a peer died."""
        if self.points is not None:
            self.points.lost_if_recovering(order)

    def before_forward(self) -> None:
        """A point still being copied out: the forward waits for it on the device (the buffers
        it writes), and any optimizer's step for the rest."""
        if self.points is not None:
            self.points.before_forward()

    def _before_update(self, optimizer, args, kwargs) -> None:
        if self.points is not None:
            self.points.before_update()

    def close(self) -> None:
        self._hook.remove()


def _alike(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and
                                    x.device == y.device for x, y in zip(a, b, strict=False))
