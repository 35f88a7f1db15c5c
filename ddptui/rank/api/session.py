"""The rank side of ddptui for your own script: `run = ddptui.init()`, then `run.step(loss,
samples=n)` in the loop. Under `ddptui run SCRIPT` it reports to the dashboard; under torchrun
with DDPTUI_REPORT=HOST:PORT to `ddptui attach`; otherwise every call is a no-op.

Nothing here waits on the device: the loss is summed where it lives and read an interval late.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from ddptui.contract.protocol import events
from ddptui.rank.api.rankside import RankSide
from ddptui.rank.api.steering import Orders

if TYPE_CHECKING:
    from ddptui.rank.api.elastic_run import Elastic
    from ddptui.rank.api.joiner import Joiner

STEPS_HZ = 4.0  # step events a second, as the built-in trainer sends them


class Run:
    """What ddptui.init() returns. Inactive (no dashboard to report to), every call is a no-op
    but epochs(), which still counts epochs and calls set_epoch."""

    def __init__(self, report: str | None, hz: float = STEPS_HZ):
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self._me = RankSide(report, 1.0 / hz)
        self.active = self._me.active
        self._orders: Orders | None = None
        self._elastic: Elastic | None = None
        self._model = None  # run.ddp()'s
        self._joining: Joiner | None = None  # r: the join order this standby was given
        if not self.active:
            return
        self._orders = Orders(self._me)
        self._clock = _watch(self._me)
        standby = os.environ.get("DDPTUI_STANDBY") == "1"
        self._me.announce(standby)
        atexit.register(self._at_exit)
        if standby:
            from ddptui.rank.api.joiner import await_join

            self._joining = await_join(self._me)

    @property
    def rank(self) -> int:
        """This rank in the current world (run.elastic()'s worlds renumber their members)."""
        return self._me.rank

    @property
    def slot(self) -> int:
        """The rank it was started as: its name on the dashboard."""
        return self._me.slot

    @property
    def world_size(self) -> int:
        return self._me.world_size

    @property
    def global_step(self) -> int:
        """Steps done since the run began (run.step() calls, less any redone after a rollback)."""
        return self._me.global_step

    @property
    def should_stop(self) -> bool:
        """q: end the loop (every rank sees it at the same step)."""
        return self._orders is not None and self._orders.stop

    @property
    def should_checkpoint(self) -> bool:
        """c: save now (true for the step after the order)."""
        return self._orders is not None and self._orders.should_checkpoint

    @property
    def paused(self) -> bool:
        return self._orders is not None and self._orders.paused

    # -- the calls a script makes ----------------------------------------------------------------
    def step(self, loss=None, samples: int = 0) -> None:
        """After each optimizer step: `loss` a tensor (never read now) or a float, `samples` the
        batch size on this rank."""
        if not self.active:
            return
        if self._elastic is not None and self._elastic.recover_pending():
            return  # this step broke with the world: it is redone from the rollback point
        me = self._me
        self._orders.should_checkpoint = False
        me.global_step += 1
        me.figures.counted(samples, loss)
        for live in me.loaders:
            live.step_done()
        if self._elastic is None:
            self._orders.take()
        elif not self._elastic.step_end():
            return
        if me.figures.due(time.perf_counter(), me.global_step):
            me.send_step()

    def epochs(self, n: int, sampler=None, start: int = 0) -> Iterator[int]:
        """for epoch in run.epochs(10, loader): calls set_epoch on a DistributedSampler (given,
        or the loader's) and marks each epoch's row."""
        sampler = getattr(sampler, "sampler", sampler)  # a DataLoader: its sampler
        if self.active and n > start:  # the header's "epoch 3 of 0-39"
            self._me.say(f"training epochs {start}-{n - 1}", kind=events.Facts, epochs=n)
        if self._me.resume is not None:  # joined a running world: its epoch
            start = max(start, self._me.resume["epoch"] or 0)
        for e in range(start, n):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(e)
            self.epoch(e)
            yield e
            if self.should_stop:
                break
        self._me.end_epoch()

    def epoch(self, e: int) -> None:
        """For a script with an epoch loop of its own: epoch `e` begins (the last one ended)."""
        if not self.active:
            return
        me = self._me
        me.end_epoch()
        # A window ends with its epoch (memory is told epoch by epoch), and the time between
        # two epochs (an evaluation, a checkpoint) is no training step's.
        self._clock.flush(restart=True)
        me.epoch = self._clock.epoch = e
        me.figures.begin_epoch(e, me.global_step)
        if me.resume is not None and me.resume["epoch"] == e:  # joined in its middle
            me.figures.epoch_steps0 -= me.resume["epoch_step"]

    def log(self, **scalars) -> None:
        """Figures of the epoch (val_loss, val_acc, lr...): the epochs table shows them."""
        if not self.active:
            return
        for name, value in scalars.items():
            self._me.figures.log(name, float(value.item() if isinstance(value, torch.Tensor)
                                             else value))

    def loader(self, dataset, batch_size: int = 1, sampler=None, **kwargs):
        """A DataLoader (same arguments) whose num_workers, pinned memory and side-stream
        prefetcher follow the dashboard's p and w/W, and cudnn.benchmark its b: from the next
        epoch, or at the next agreed step with a, on every rank at the same step. Inactive: a
        plain DataLoader."""
        if not self.active:
            from torch.utils.data import DataLoader

            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        from ddptui.rank.api.loader import LiveLoader

        me = self._me
        live = LiveLoader(dataset, batch_size, sampler, **kwargs)
        if self._elastic is not None:
            self._elastic.adopt(live)
        me.loaders.append(live)
        if len(me.loaders) == 1:  # the first one's settings are the run's
            live.on_applied = self._orders.applied
            me.reporter.emit(events.Rank(rank=me.reporter.rank, state="running",
                             control=me.controls(self._elastic is not None)))
            if me.rank == 0:
                me.reporter.emit(events.Settings(rank=me.reporter.rank,
                                                 settings=dict(live.settings), epoch=me.epoch or 0,
                                 status="applied"))
        return live

    def ddp(self, module: torch.nn.Module, **kwargs) -> torch.nn.Module:
        """DistributedDataParallel(module, **kwargs); for run.elastic(), one that ddptui builds
        again over each new world (use it as your DDP model)."""
        if not self.active:
            return torch.nn.parallel.DistributedDataParallel(module, **kwargs)
        from ddptui.rank.api.elastic_run import ElasticDDP

        self._model = ElasticDDP(module, in_sync=self._joining is not None, **kwargs)
        return self._model

    def elastic(self, state_dict_fn: Callable[[], Any], load_state_dict_fn: Callable[[Any], None],
                every: int | None = None) -> None:
        """A rank may leave (s), die (k, a crash) or join (r) while the others go on, from
        rollback points of what state_dict_fn() returns (every `every` steps and at each epoch's
        start). Needs run.ddp(), run.loader() and run.guard(): docs/your-script.md."""
        from ddptui.rank.api.elastic_run import POINT_EVERY, Elastic

        if not self.active:
            return
        if self._model is None:
            raise ValueError("run.elastic() needs the model wrapped first: model = run.ddp(model)")
        self._elastic = Elastic(self._me, self._orders, state_dict_fn, load_state_dict_fn,
                                self._model, every or POINT_EVERY)
        self._elastic.start(self._joining)
        self._me.reporter.emit(events.Rank(rank=self._me.reporter.rank,
                                           state="running", control=self._me.controls(True)))

    def guard(self) -> contextlib.AbstractContextManager:
        """`with run.guard():` around a step (forward, backward, optimizer step, run.step): when
        a peer dies in it, the error is caught and the step redone after the recovery."""
        if self._elastic is None:
            return contextlib.nullcontext()
        from ddptui.rank.api.elastic_run import Guard

        return Guard(self._elastic)

    def on_checkpoint(self, fn: Callable[[], None]) -> None:
        """Call `fn` on every rank at the same step when the dashboard asks for a checkpoint."""
        if self._orders is not None:
            self._orders.callbacks.append(fn)

    def done(self) -> None:
        """The end of training (called at exit if the script does not)."""
        me = self._me
        if not self.active or me.finished:
            return
        me.finished = True
        me.send_step()
        self._clock.flush()
        me.end_epoch()
        me.reporter.emit(events.Rank(rank=me.reporter.rank, state="done", pid=os.getpid()))
        if me.rank == 0 and not me.supervised:
            me.reporter.emit(events.Run(rank=me.reporter.rank, status="done", exit_code=0))
        self._close()

    def _at_exit(self) -> None:
        """The script ended without run.done(): done, unless an uncaught error ended it (ddptui
        reports the crash from the exit code and the traceback)."""
        if getattr(sys, "last_value", None) is None:
            self.done()
        elif self.active and not self._me.finished:
            self._me.finished = True
            self._close()

    def _close(self) -> None:
        if self._elastic is not None:
            self._elastic.close()
        self._me.close()


def _watch(me: RankSide):
    """The step clock's hooks (installed at the rank's start under `ddptui run SCRIPT`, here
    otherwise), their windows sent on this rank's link from now on; DDPTUI_STEP_CLOCK=0: none
    (a Watch with no clock marks nothing)."""
    from ddptui.rank.telemetry.instrument import clock_on
    from ddptui.rank.telemetry.script_watch import Watch, watch_everything

    if not clock_on():
        return Watch(me.slot, me.reporter.emit)

    watch = watch_everything(me.slot, me.reporter.emit)
    watch.rank, watch.send = me.slot, me.reporter.emit
    if watch.clock is not None:
        watch.clock.rank = me.slot
    return watch


_RUN: list[Run] = []  # a process has one link to its dashboard, however often init() is called


def init(report: str | None = None) -> Run:
    """The run object for this rank: reports to `report` (HOST:PORT), else $DDPTUI_REPORT (set
    by `ddptui run SCRIPT`, or by you under torchrun for `ddptui attach`); without either, a
    run whose calls do nothing. Called again (a framework callback and the script), the same."""
    if not _RUN:
        _RUN.append(Run(report or os.environ.get("DDPTUI_REPORT") or None))
    return _RUN[0]


__all__ = ["Run", "init"]
