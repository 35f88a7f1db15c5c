"""The hooks on a DDP model that tell a step clock where its step is: its forward (pre and post
hooks), its last gradient bucket and the end of its all-reduce (a comm hook around the one in
use: DDP's own, or the script's). Used by the built-in loop and, through script_watch.py, in
training code ddptui did not write.

The hooks only mark (`marks`: a StepClock, or a Watch that turns itself off at its first error);
none waits or reads a tensor, and copied or pickled with their model they mark nothing.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported by the script, not here: this loads before it runs
    import torch

    from ddptui.rank.telemetry.phases import StepClock

_WATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP model -> its marks
# DDP model -> its timed comm hook, or None where it has one ddptui cannot time (a C++ one)
_TIMED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_REGISTERED = object()  # a hook's state: the one DDP was given with it


def clock_on() -> bool:
    """DDPTUI_STEP_CLOCK=0 turns the step clock off (to measure what it costs: bench/)."""
    return os.environ.get("DDPTUI_STEP_CLOCK", "1") != "0"


class _Hook:
    """A module hook that marks; copied or pickled with its module (torch.save, a deepcopy for
    an EMA), it marks nothing."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    def __reduce__(self):
        return _Hook, (_nothing,)


def _nothing(*_args) -> None:
    return None


def watch_ddp(ddp: torch.nn.Module, marks: Any, comm: bool = True) -> None:
    """Forward and backward from DDP's module hooks; with `comm`, the all-reduce left after
    backward from a comm hook registered at the first forward (the script's own, registered
    before, is timed instead). A forward with no gradient (an evaluation) is no step's."""
    if _WATCHED.get(ddp) is marks:
        return
    _WATCHED[ddp] = marks

    def before_forward(module, args) -> None:
        if not _grad():
            return
        # DDP syncs before the model's forward (its buffers from rank 0: BatchNorm's running
        # statistics): a wait for the others, as the all-reduce's is; the model's own forward
        # starts at its pre-hook, after it.
        marks.begin("comm" if comm and _syncs_buffers(module) else "forward")
        if comm and module not in _TIMED:
            _default_comm_hook(module, marks)

    def model_forward(module, args) -> None:
        if _grad():
            marks.begin("forward")

    def after_forward(module, args, out) -> None:
        if _grad():
            marks.begin("backward")
        else:
            marks.restart()  # the evaluation's time so far is no training step's

    ddp.register_forward_pre_hook(_Hook(before_forward))
    # First of the model's pre-hooks: the script's own (a wait, a cast) are its forward's
    ddp.module.register_forward_pre_hook(_Hook(model_forward), prepend=True)
    ddp.register_forward_hook(_Hook(after_forward))


class Timed:
    """A DDP comm hook (`hook`), marking when the step's last bucket is handed to it
    (backward's gradients are done) and when the backward pass ends (DDP has waited for every
    bucket's all-reduce): the communication backward did not hide. `ours`: ddptui registered
    it around DDP's own all-reduce, and a hook the script registers later takes its place."""

    def __init__(self, hook: Callable, marks: Any, ours: bool = False):
        self.hook, self.marks, self.ours = hook, marks, ours
        self.state: Any = _REGISTERED  # the script's state, where its hook took ours' place
        # DDP's logger names the hook it was given
        self.__name__ = getattr(hook, "__name__", type(hook).__name__)
        self.__qualname__ = getattr(hook, "__qualname__", self.__name__)

    def __call__(self, state, bucket):
        # DDP.join() calls it outside backward, where nothing can be queued
        if bucket.is_last() and _in_backward():
            self.marks.begin("comm")
            _engine().queue_callback(self._after_ddp)
        return self.hook(state if self.state is _REGISTERED else self.state, bucket)

    def _after_ddp(self) -> None:
        # Queued from the hook, this runs before DDP's own end of backward (queued just after
        # the last bucket): queued from here, after it, once every all-reduce is waited for.
        _engine().queue_callback(self._done)

    def _done(self) -> None:
        self.marks.begin("optimizer" if self.marks.stepping else "rest")

    def __reduce__(self):
        return _same, (self.hook,)


def _same(hook: Callable) -> Callable:
    return hook


def timed(ddp: torch.nn.Module, hook: Callable, state: Any) -> tuple[Any, Callable] | None:
    """What DDP.register_comm_hook should register for `hook` on a watched model: (state, its
    timed hook); None where ddptui's own is in already and `hook` took its place there."""
    marks, already = _WATCHED.get(ddp), _TIMED.get(ddp)
    if marks is None or isinstance(hook, Timed):
        return state, hook
    if isinstance(already, Timed) and already.ours:
        ddp._check_comm_hook(hook)
        already.hook, already.state, already.ours = hook, state, False
        already.__name__ = getattr(hook, "__name__", type(hook).__name__)
        already.__qualname__ = getattr(hook, "__qualname__", already.__name__)
        return None
    wrapped = _TIMED[ddp] = Timed(hook, marks)
    return state, wrapped


def _default_comm_hook(ddp, marks: Any) -> None:
    """DDP's own all-reduce as a comm hook the marks see; none where the script has one
    already that ddptui cannot see into (a C++ one: fp16 compression), whose wait stays in
    backward, or where DDPTUI_COMM_HOOK=0 keeps DDP's C++ reduction."""
    if ddp._comm_hooks or ddp._get_ddp_logging_data().get("comm_hook") or os.environ.get(
            "DDPTUI_COMM_HOOK") == "0":
        _TIMED[ddp] = None
        return
    hook = _TIMED[ddp] = Timed(_reduction(ddp.process_group), marks, ours=True)
    # The group rides in the hook, not as DDP's state: DDP keeps the state it is given, and
    # a model saved whole (torch.save) cannot take a process group with it.
    hook.state = ddp.process_group
    ddp.register_comm_hook(None, hook)


def _reduction(group) -> Callable:
    """On NCCL, the mean taken by NCCL itself; elsewhere torch's allreduce_hook (a sum after
    each bucket is divided: one more pass over the gradients)."""
    dist = sys.modules["torch.distributed"]
    if "nccl" in str(dist.get_backend(group)):
        return average
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook


def average(group, bucket):
    """A bucket's mean over the world in one NCCL all-reduce (ncclAvg), as DDP's C++ reduction
    divides while it copies the gradients into the bucket: no pass over them is added."""
    dist = sys.modules["torch.distributed"]
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.AVG, group=group, async_op=True)
    return work.get_future().then(_reduced)


def _reduced(fut):
    return fut.value()[0]


def _syncs_buffers(ddp) -> bool:
    """Whether this forward of DDP's starts with its buffers' broadcast (a model with buffers,
    broadcast_buffers on): with none to sync, its time before the model's is its own."""
    try:
        return bool(ddp.will_sync_module_buffers())
    except Exception:  # a torch without it: the broadcast, if any, stays in forward
        return False


def _grad() -> bool:
    return sys.modules["torch"].is_grad_enabled()


def _in_backward() -> bool:
    current = getattr(sys.modules["torch"]._C, "_current_graph_task_id", None)
    return current is None or current() != -1


def _engine():
    return sys.modules["torch"].autograd.Variable._execution_engine


def out_of_memory(error: BaseException) -> bool:
    torch = sys.modules.get("torch")
    kind = getattr(torch, "OutOfMemoryError", None) or getattr(
        getattr(torch, "cuda", None), "OutOfMemoryError", None)  # torch < 2.5: cuda's
    return kind is not None and isinstance(error, kind)


def oom_line(clock: StepClock) -> str:
    memory = clock.memory()
    peak, limit = memory.get("mem_peak"), memory.get("mem_limit")
    of = f" of {limit:,.0f} MiB" if limit else ""
    return (f"ddptui: rank {clock.rank} ran out of memory in {clock.phase} "
            f"(its peak {peak:,.0f} MiB{of})")
