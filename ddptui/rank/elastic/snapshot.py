"""Rollback points for crash recovery: copies of the training state kept in host memory.

Every few steps the model, optimizer and scaler tensors are copied to pinned host memory on a
side stream (no host sync; the next step's forward waits only for the buffers, its optimizer
step for the rest), with the host-side position next to them; after a rank dies, the survivors
agree on a point every one of them holds and known to be good, and restore it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from ddptui.contract.protocol.orders import Order, Recover
from ddptui.rank.compat import scaler_tensors


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  scaler: torch.amp.GradScaler) -> list[torch.Tensor]:
    """Every tensor a replica's training state lives in, in an order all ranks share: the
    model's buffers first (a forward writes them), then what only an optimizer step writes."""
    buffers, params = _model_state(model)
    tensors = buffers + params
    for group in optimizer.param_groups:
        for p in group["params"]:
            tensors += [v for v in optimizer.state.get(p, {}).values() if torch.is_tensor(v)]
    if scaler.is_enabled():
        tensors += scaler_tensors(scaler)  # created in build_optimizer
    return [t.detach() for t in tensors]


def buffer_count(model: torch.nn.Module) -> int:
    """How many of state_tensors' first tensors are buffers (running statistics)."""
    return len(_model_state(model)[0])


def _model_state(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The model's state_dict tensors: (buffers, parameters)."""
    params = {id(p) for p in model.parameters()}
    state = list(model.state_dict(keep_vars=True).values())
    return [t for t in state if id(t) not in params], [t for t in state if id(t) in params]


@dataclass
class Point:
    tensors: list[torch.Tensor]
    step: int = -1  # global step the copy was taken after
    host: dict = field(default_factory=dict)
    event: torch.cuda.Event | None = None  # recorded after the following step was queued
    confirmed: bool = False


class Snapshots:
    """Two rollback points, taken alternately.

    A point taken after step S is good once step S+1's gradient all-reduce has completed on any
    rank: that needs every rank's step S+1 input, which each rank's stream only produces after
    its copy of S. On CUDA that is seen through an event, checked before the world is known to
    be lost (a lock orders the check against `lost_if_recovering`: an abort also completes
    events). On CPU a step is done when the host returns from it, so a point is good when taken.
    """

    def __init__(self, tensors: list[torch.Tensor], cuda: bool, buffers: int = 0):
        self.live = tensors
        self.cuda = cuda
        self.buffers = buffers  # the first `buffers` tensors are written by a forward
        self.points = [Point([_host_like(t) for t in tensors]) for _ in range(2)]
        self.newest = self.points[0]  # read every step: kept, not searched for
        self.lock = threading.Lock()
        self.lost = False
        self.side = torch.cuda.Stream() if cuda else None
        self.copying: list[torch.cuda.Event] = []  # [buffers copied, the rest copied]

    def take(self, step: int, host: dict, agreed: bool = False) -> None:
        """A point after `step`. `agreed`: every rank of a new world is known to hold this
        state (it was just restored or shared), so it is good without waiting for a step."""
        older, newer = sorted(self.points, key=lambda pt: pt.step)
        if newer.step == step:  # nothing trained since (an epoch's end): only the position moved
            newer.host = host
            newer.confirmed = newer.confirmed or agreed
            return
        if newer.step >= 0 and not agreed and not self._confirm(newer, block=True):
            raise WorldLost("the world was lost while taking a rollback point")
        self._copy_out(older.tensors)
        older.step, older.host, older.event = step, host, None
        older.confirmed = agreed or not self.cuda
        self.newest = older

    def _copy_out(self, into: list[torch.Tensor]) -> None:
        if not self.cuda:
            torch._foreach_copy_(into, self.live)
            return
        self.side.wait_stream(torch.cuda.current_stream())
        self.copying = []
        with torch.cuda.stream(self.side):
            for part in (slice(0, self.buffers), slice(self.buffers, None)):
                for dst, src in zip(into[part], self.live[part], strict=True):
                    dst.copy_(src, non_blocking=True)
                self.copying.append(torch.cuda.Event())
                self.copying[-1].record()

    def before_forward(self) -> None:
        """The compute stream waits (on the device) until the buffers are copied out."""
        if self.copying:
            torch.cuda.current_stream().wait_event(self.copying[0])

    def before_update(self) -> None:
        """... and until the parameters and optimizer state are, before an update writes them."""
        if self.copying:
            torch.cuda.current_stream().wait_event(self.copying[1])
            self.copying = []

    def step_done(self, step: int) -> None:
        """After each step: the step after the newest point gets the event that confirms it."""
        newest = self.newest
        if self.cuda and newest.step == step - 1 and newest.event is None:
            newest.event = torch.cuda.Event()
            newest.event.record()

    def lost_if_recovering(self, order: Order) -> None:
        """A mailbox's urgent order, on its thread, before the world's communicators are
        aborted: a recover order means a peer died, and a point whose copy is under way may
        lack what it was to agree on."""
        if isinstance(order, Recover):
            with self.lock:
                self.lost = True

    def summary(self) -> dict:
        for pt in self.points:
            self._confirm(pt, block=False)
        return {"held": [pt.step for pt in self.points if pt.step >= 0],
                "confirmed": max((pt.step for pt in self.points if pt.confirmed), default=-1)}

    def restore(self, step: int) -> dict:
        """Copy the point taken after `step` back; return its host-side state."""
        (pt,) = [pt for pt in self.points if pt.step == step]
        self.before_update()
        for dst, src in zip(self.live, pt.tensors, strict=True):
            dst.copy_(src, non_blocking=True)  # from pinned memory, in stream order
        for other in self.points:
            if other.step > step:  # a timeline that was abandoned
                other.step, other.event, other.confirmed = -1, None, False
        pt.confirmed = True
        self.newest = pt
        with self.lock:
            self.lost = False
        return pt.host

    def _confirm(self, pt: Point, block: bool) -> bool:
        if pt.confirmed or pt.event is None:
            return pt.confirmed
        if block:
            pt.event.synchronize()  # long done in practice: the host runs only a step or two ahead
        with self.lock:
            if not self.lost and pt.event.query():
                pt.confirmed = True
        return pt.confirmed


def _host_like(t: torch.Tensor) -> torch.Tensor:
    """Pinned host memory with the tensor's own strides (channels_last stays one memcpy)."""
    if t.device.type != "cuda":
        return torch.empty_like(t)
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu", pin_memory=True)


def agree(summaries: list[dict]) -> int | None:
    """The newest point every survivor holds and some survivor knows to be good."""
    common = set.intersection(*(set(s["held"]) for s in summaries))
    good = max(s["confirmed"] for s in summaries)
    choices = [step for step in common if step <= good]
    return max(choices) if choices else None


class WorldLost(RuntimeError):
    """A rank of this world is gone; the supervisor's recover order says what comes next."""
