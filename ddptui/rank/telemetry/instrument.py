"""The hooks that tell a rank's StepClock where its step is, in training code ddptui did not
write: DDP's forward (pre and post hooks), its last gradient bucket and the end of its
all-reduce (a comm hook around the one in use), torch.optim's steps, DataLoader's batches.

Each hook only marks the clock; none waits, reads a tensor or raises into the script.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ddptui.contract.protocol.steptime import Phases

if TYPE_CHECKING:  # torch is imported by the script, not here: this loads before it runs
    import torch

    from ddptui.rank.telemetry.phases import StepClock

# What the hooks can tell apart in code of yours: the copy to the device is yours, in `rest`.
SCRIPT_PHASES = ("data", "forward", "backward", "comm", "optimizer")


def clock_on() -> bool:
    """DDPTUI_STEP_CLOCK=0 turns the step clock off (to measure what it costs: bench/)."""
    return os.environ.get("DDPTUI_STEP_CLOCK", "1") != "0"


def watch_ddp(ddp: torch.nn.Module, clock: StepClock, comm: bool = True) -> None:
    """Forward and backward from DDP's module hooks; with `comm`, the all-reduce left after
    backward from a comm hook registered at the first forward (unless the script registers
    its own first: then that one is timed)."""
    if getattr(ddp, "_ddptui_clock", None) is clock:
        return
    ddp._ddptui_clock = clock

    def before_forward(module, args) -> None:
        clock.begin("forward")
        if comm and not getattr(module, "_ddptui_comm", False):
            module._ddptui_comm = True
            _default_comm_hook(module, clock)

    ddp.register_forward_pre_hook(before_forward)
    ddp.register_forward_hook(lambda module, args, out: clock.begin("backward"))


def timed_comm_hook(hook: Callable, clock: StepClock) -> Callable:
    """`hook` (a DDP comm hook), telling the clock when the step's last bucket is handed to it
    (backward's gradients are done) and when the backward pass ends (DDP has waited for every
    bucket's all-reduce): the communication backward did not hide."""
    from torch.autograd import Variable

    engine = Variable._execution_engine

    def comm_done() -> None:
        clock.begin("optimizer" if clock.stepping else "rest")

    def after_ddp() -> None:
        # Queued from the hook, this runs before DDP's own end of backward (queued just after
        # the last bucket): queued from here, after it, once every all-reduce is waited for.
        engine.queue_callback(comm_done)

    @functools.wraps(hook)
    def timed(state, bucket):
        if bucket.is_last():
            clock.begin("comm")
            engine.queue_callback(after_ddp)
        return hook(state, bucket)

    return timed


def _default_comm_hook(ddp, clock: StepClock) -> None:
    """DDP's own all-reduce, as a comm hook the clock sees; none where the script has one (a
    built-in one, fp16 compression: not seen, its time stays in backward)."""
    if ddp._comm_hooks or ddp._get_ddp_logging_data().get("comm_hook"):
        return
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp.register_comm_hook(ddp.process_group, timed_comm_hook(allreduce_hook, clock))


class Watch:
    """The process's hooks and its clock, made when the first DDP model is (its device decides
    CUDA events or host clocks); marks before that go nowhere. `send` takes each window: a
    record file's writer, or a dashboard link once `ddptui.init()` has one."""

    def __init__(self, rank: int, send: Callable[[Phases], None]):
        self.rank, self.send = rank, send
        self.clock: StepClock | None = None
        self.epoch: int | None = None

    def begin(self, phase: str) -> None:
        if self.clock is not None:
            self.clock.begin(phase)

    def step_begins(self) -> None:
        if self.clock is not None:
            self.clock.stepping = True
            self.clock.begin("optimizer")

    def step_end(self) -> None:
        if self.clock is not None:
            self.clock.stepping = False
            self.clock.epoch = self.epoch
            self.clock.step_end()

    def flush(self, restart: bool = False) -> None:
        """The steps not sent yet, as a window (at exit, an epoch's end); with `restart`, what
        comes until the next mark is no step's (the loop's epoch boundary)."""
        if self.clock is not None:
            self.clock.flush()
            if restart:
                self.clock.restart()

    def model(self, ddp: torch.nn.Module) -> None:
        """A DDP model was built: the clock starts on its device."""
        import torch

        from ddptui.rank.telemetry.phases import StepClock

        if self.clock is None:
            device = getattr(ddp, "device", None)
            self.clock = StepClock(self.rank, lambda ev: self.send(ev),
                                   device if isinstance(device, torch.device) else None,
                                   SCRIPT_PHASES)
        watch_ddp(ddp, self.clock)


_WATCH: list[Watch] = []  # a process has one (torch's hooks are process-wide)


def watch_everything(rank: int, send: Callable[[Phases], None]) -> Watch:
    """A script of yours, no line changed: every DDP model built from now on, every optimizer
    step, every DataLoader batch, and an out-of-memory error's phase and peak. Once a process."""
    if _WATCH:
        return _WATCH[0]
    from ddptui.rank.patching import after_import

    watch = Watch(rank, send)
    _WATCH.append(watch)
    after_import({
        "torch.nn.parallel.distributed": lambda module: _patch_ddp(module.DistributedDataParallel,
                                                                   watch),
        "torch.optim.optimizer": lambda module: _optimizer_hooks(module, watch),
        "torch.utils.data.dataloader": lambda module: _patch_loader(module._BaseDataLoaderIter,
                                                                    watch),
    })
    say_out_of_memory(watch)
    return watch


def _patch_ddp(cls, watch: Watch) -> None:
    built, register = cls.__init__, cls.register_comm_hook

    @functools.wraps(built)
    def __init__(self, *args, **kwargs):
        built(self, *args, **kwargs)
        watch.model(self)

    @functools.wraps(register)
    def register_comm_hook(self, state, hook):
        clock = getattr(self, "_ddptui_clock", None)
        if clock is None or getattr(self, "_ddptui_comm", False):  # ours is in: yours can't be
            return register(self, state, hook)
        self._ddptui_comm = True
        return register(self, state, timed_comm_hook(hook, clock))

    cls.__init__, cls.register_comm_hook = __init__, register_comm_hook


def _optimizer_hooks(module, watch: Watch) -> None:
    module.register_optimizer_step_pre_hook(lambda *_: watch.step_begins())
    module.register_optimizer_step_post_hook(lambda *_: watch.step_end())


def _patch_loader(cls, watch: Watch) -> None:
    taken = cls.__next__

    @functools.wraps(taken)
    def __next__(self):
        watch.begin("data")
        try:
            return taken(self)
        finally:
            watch.begin("rest")

    cls.__next__ = __next__


def say_out_of_memory(watch: Watch) -> None:
    """An uncaught out-of-memory error says the phase it came in and the rank's peak, in one
    line on stderr before its traceback (the dashboard shows the rank's last lines)."""
    before = sys.excepthook

    def hook(kind, value, tb) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(value, torch.OutOfMemoryError) and \
                watch.clock is not None:
            print(oom_line(watch.clock), file=sys.stderr, flush=True)
        before(kind, value, tb)

    sys.excepthook = hook


def oom_line(clock: StepClock) -> str:
    memory = clock.memory()
    peak, limit = memory.get("mem_peak"), memory.get("mem_limit")
    of = f" of {limit:,.0f} MiB" if limit else ""
    return (f"ddptui: rank {clock.rank} ran out of memory in {clock.phase} "
            f"(its peak {peak:,.0f} MiB{of})")
