"""The step clock in a script ddptui did not write: every DDP model built from its start on
(instrument.py's hooks), torch.optim's steps (the global step hooks), DataLoader's batches, and
an out-of-memory error's phase and peak. Installed before the script's first line runs.

A hook that fails turns the clock off with one line on stderr; the script runs as without it.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ddptui.contract.protocol.steptime import Phases
from ddptui.rank.telemetry.instrument import oom_line, out_of_memory, timed, watch_ddp

if TYPE_CHECKING:
    import torch

    from ddptui.rank.telemetry.phases import StepClock

# What the hooks can tell apart in code of yours: the copy to the device is yours, in `rest`.
SCRIPT_PHASES = ("data", "forward", "backward", "comm", "optimizer")


class Watch:
    """The process's hooks and its clock, made when the first DDP model is (its device decides
    CUDA events or host clocks; its thread is the training loop's); marks before that go
    nowhere. `send` takes each window: a record file's writer, or a dashboard link once
    `ddptui.init()` has one."""

    def __init__(self, rank: int, send: Callable[[Phases], None]):
        self.rank, self.send = rank, send
        self.clock: StepClock | None = None
        self.epoch: int | None = None
        self.thread: int | None = None  # the training loop's

    @property
    def stepping(self) -> bool:
        return self.clock is not None and self.clock.stepping

    def begin(self, phase: str) -> None:
        if self.clock is not None:
            try:
                self.clock.begin(phase)
            except Exception as e:
                self._stopped(e)

    def restart(self) -> None:
        if self.clock is not None:
            try:
                self.clock.restart()
            except Exception as e:
                self._stopped(e)

    def step_begins(self) -> None:
        if self.clock is not None:
            self.clock.stepping = True
            self.begin("optimizer")

    def step_end(self) -> None:
        if self.clock is not None:
            self.clock.stepping = False
            self.clock.epoch = self.epoch
            try:
                self.clock.step_end()
            except Exception as e:
                self._stopped(e)

    def flush(self, restart: bool = False) -> None:
        """The steps not sent yet, as a window (at exit, an epoch's end); with `restart`, what
        comes until the next mark is no step's (the loop's epoch boundary)."""
        if self.clock is not None:
            try:
                self.clock.flush()
                if restart:
                    self.clock.restart()
            except Exception as e:
                self._stopped(e)

    def model(self, ddp: torch.nn.Module) -> None:
        """A DDP model was built: the clock starts on its device, in this thread."""
        try:
            if self.clock is None:
                import torch

                from ddptui.rank.telemetry.phases import StepClock

                device = getattr(ddp, "device", None)
                self.clock = StepClock(self.rank, lambda ev: self.send(ev),
                                       device if isinstance(device, torch.device) else None,
                                       SCRIPT_PHASES)
                self.thread = threading.get_ident()
            watch_ddp(ddp, self)
        except Exception as e:
            self._stopped(e)

    def _stopped(self, error: Exception) -> None:
        self.clock = None
        print(f"ddptui: rank {self.rank}: the phases of its steps are not timed any more: "
              f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)


_WATCH: list[Watch] = []  # a process has one (torch's hooks are process-wide)


def watch_everything(rank: int, send: Callable[[Phases], None]) -> Watch:
    """The hooks, once a process: on DDP models built from now on, optimizer steps, DataLoader
    batches, and an uncaught out-of-memory error."""
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
        given = timed(self, hook, state)
        return None if given is None else register(self, *given)

    cls.__init__, cls.register_comm_hook = __init__, register_comm_hook


def _optimizer_hooks(module, watch: Watch) -> None:
    module.register_optimizer_step_pre_hook(lambda *_: watch.step_begins())
    module.register_optimizer_step_post_hook(lambda *_: watch.step_end())


def _patch_loader(cls, watch: Watch) -> None:
    taken = cls.__next__

    @functools.wraps(taken)
    def __next__(self):
        if threading.get_ident() != watch.thread:  # a prefetching thread's: not the loop's wait
            return taken(self)
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
        if watch.clock is not None and out_of_memory(value):
            try:
                print(oom_line(watch.clock), file=sys.stderr, flush=True)
            except Exception:  # the traceback below says what matters
                pass
        before(kind, value, tb)

    sys.excepthook = hook
