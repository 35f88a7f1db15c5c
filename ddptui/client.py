"""The rank side of ddptui for your own script: `run = ddptui.init()`, then `run.step(loss,
samples=n)` in the loop. Under `ddptui run SCRIPT` it reports to the dashboard; under torchrun
with DDPTUI_REPORT=HOST:PORT to `ddptui attach`; otherwise every call is a no-op.

Nothing here waits on the device: the loss is summed where it lives and read an interval late.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist

from ddptui.figures import Figures
from ddptui.kit.elastic.control import CONTROL_OFF, Control, Mailbox, every_rank_linked
from ddptui.kit.protocol.channel import load_key, parse_address
from ddptui.kit.telemetry.gpu import DeviceSampler, physical_index
from ddptui.kit.telemetry.remote import RemoteLink, node_name
from ddptui.kit.telemetry.reporter import Reporter

if TYPE_CHECKING:
    from ddptui.elastic import Elastic

STEPS_HZ = 4.0  # step events a second, as the built-in trainer sends them
CONTROLS = ["pause", "checkpoint", "stop"]  # what the dashboard may ask of a script that steps


class Run:
    """What ddptui.init() returns. Inactive (no dashboard to report to), every call is a no-op
    but epochs(), which still counts epochs and calls set_epoch."""

    def __init__(self, report: str | None, hz: float = STEPS_HZ):
        self.rank = int(os.environ.get("RANK", 0))  # in the current world
        self.slot = self.rank  # the rank it was started as: its name on the dashboard
        self.world_size = int(os.environ.get("WORLD_SIZE", 1))
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.active = bool(report)
        self.should_stop = False  # q: end the loop (every rank sees it at the same step)
        self.should_checkpoint = False  # c: save now (true for the step after the order)
        self.paused = False
        self.global_step = 0
        self._callbacks: list[Callable[[], None]] = []
        self._loaders: list = []  # run.loader()'s, whose settings the dashboard steers
        self._epoch: int | None = None
        self._done = False
        self._elastic: Elastic | None = None
        self._model = None  # run.ddp()'s
        self._joining: dict | None = None  # r: the join order this standby was given
        self._resume: dict | None = None  # where a rank that joined a running world takes up
        if not self.active:
            return
        self._supervised = os.environ.get("DDPTUI_PARENT") == str(os.getppid())
        self.reporter = Reporter(self.slot)
        self.link = RemoteLink(parse_address(report, "DDPTUI_REPORT"), load_key()[0],
                               node_name(), lambda text: print(f"ddptui: rank {self.rank}: "
                                                               f"{text}", file=sys.stderr))
        self.reporter.sinks.append(self.link)
        self._mailbox = Mailbox(self.link.inbox)
        self._control: Control | None = None
        self._control_off = False  # not every rank reports: no orders are agreed
        self.figures = Figures(self.reporter, 1.0 / hz)
        self._threads = [] if self._supervised else [DeviceSampler(
            self.reporter.emit, lambda text: self._say(text, "warning"), _physical_gpu())]
        self._announce()
        atexit.register(self._at_exit)
        if os.environ.get("DDPTUI_STANDBY") == "1":
            from ddptui.elastic import await_join

            self._joining = await_join(self)

    # -- the calls a script makes ----------------------------------------------------------------
    def step(self, loss=None, samples: int = 0) -> None:
        """After each optimizer step: `loss` a tensor (never read now) or a float, `samples` the
        batch size on this rank."""
        if not self.active:
            return
        if self._elastic is not None and self._elastic.recover_pending():
            return  # this step broke with the world: it is redone from the rollback point
        self.should_checkpoint = False
        self.global_step += 1
        self.figures.counted(samples, loss)
        for live in self._loaders:
            live.step_done()
        if self._elastic is None:
            self._take_orders()
        elif not self._elastic.step_end():
            return
        now = time.perf_counter()
        if self.figures.due(now, self.global_step):
            self.figures.send_step(now, self.global_step, self._taken_wait())

    def epochs(self, n: int, sampler=None, start: int = 0) -> Iterator[int]:
        """for epoch in run.epochs(10, loader): calls set_epoch on a DistributedSampler (given,
        or the loader's) and marks each epoch's row."""
        sampler = getattr(sampler, "sampler", sampler)  # a DataLoader: its sampler
        if self._resume is not None:  # joined a running world: its epoch
            start = max(start, self._resume["epoch"] or 0)
        for e in range(start, n):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(e)
            self.epoch(e)
            yield e
            if self.should_stop:
                break
        self._end_epoch()

    def epoch(self, e: int) -> None:
        """For a script with an epoch loop of its own: epoch `e` begins (the last one ended)."""
        if not self.active:
            return
        self._end_epoch()
        self._epoch = e
        self.figures.begin_epoch(e, self.global_step)
        if self._resume is not None and self._resume["epoch"] == e:  # joined in its middle
            self.figures.epoch_steps0 -= self._resume["epoch_step"]

    def log(self, **scalars) -> None:
        """Figures of the epoch (val_loss, val_acc, lr...): the epochs table shows them."""
        if not self.active:
            return
        for name, value in scalars.items():
            self.figures.log(name, float(value.item() if isinstance(value, torch.Tensor)
                                         else value))

    def loader(self, dataset, batch_size: int = 1, sampler=None, **kwargs):
        """A DataLoader (same arguments) whose num_workers, pinned memory and side-stream
        prefetcher follow the dashboard's p and w/W, and cudnn.benchmark its b: from the next
        epoch, or at the next agreed step with a, on every rank at the same step. Inactive: a
        plain DataLoader."""
        if not self.active:
            from torch.utils.data import DataLoader

            return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        from ddptui.loader import LiveLoader

        live = LiveLoader(dataset, batch_size, sampler, **kwargs)
        if self._elastic is not None:
            self._elastic.adopt(live)
        self._loaders.append(live)
        if len(self._loaders) == 1:  # the first one's settings are the run's
            live.on_applied = self._applied
            self.reporter.emit("rank", state="running", control=self._controls())
            if self.rank == 0:
                self.reporter.emit("settings", settings=dict(live.settings), epoch=self._epoch
                                   or 0, status="applied")
        return live

    def ddp(self, module: torch.nn.Module, **kwargs) -> torch.nn.Module:
        """DistributedDataParallel(module, **kwargs); for run.elastic(), one that ddptui builds
        again over each new world (use it as your DDP model)."""
        if not self.active:
            return torch.nn.parallel.DistributedDataParallel(module, **kwargs)
        from ddptui.elastic import ElasticDDP

        self._model = ElasticDDP(module, in_sync=self._joining is not None, **kwargs)
        return self._model

    def elastic(self, state_dict_fn: Callable[[], Any], load_state_dict_fn: Callable[[Any], None],
                every: int | None = None) -> None:
        """A rank may leave (s), die (k, a crash) or join (r) while the others go on, from
        rollback points of what state_dict_fn() returns (every `every` steps and at each epoch's
        start). Needs run.ddp(), run.loader() and run.guard(): docs/your-script.md."""
        from ddptui.elastic import POINT_EVERY, Elastic

        if not self.active:
            return
        if self._model is None:
            raise ValueError("run.elastic() needs the model wrapped first: model = run.ddp(model)")
        self._elastic = Elastic(self, state_dict_fn, load_state_dict_fn, self._model,
                                every or POINT_EVERY)
        self._elastic.start(self._joining)
        self.reporter.emit("rank", state="running", control=self._controls())

    def guard(self) -> contextlib.AbstractContextManager:
        """`with run.guard():` around a step (forward, backward, optimizer step, run.step): when
        a peer dies in it, the error is caught and the step redone after the recovery."""
        if self._elastic is None:
            return contextlib.nullcontext()
        from ddptui.elastic import Guard

        return Guard(self._elastic)

    def on_checkpoint(self, fn: Callable[[], None]) -> None:
        """Call `fn` on every rank at the same step when the dashboard asks for a checkpoint."""
        self._callbacks.append(fn)

    def done(self) -> None:
        """The end of training (called at exit if the script does not)."""
        if not self.active or self._done:
            return
        self._done = True
        self.figures.send_step(time.perf_counter(), self.global_step, self._taken_wait())
        self._end_epoch()
        self.reporter.emit("rank", state="done", pid=os.getpid())
        if self.rank == 0 and not self._supervised:
            self.reporter.emit("run", status="done", exit_code=0)
        self._close()

    def _at_exit(self) -> None:
        """The script ended without run.done(): done, unless an uncaught error ended it (ddptui
        reports the crash from the exit code and the traceback)."""
        if getattr(sys, "last_value", None) is None:
            self.done()
        elif self.active and not self._done:
            self._done = True
            self._close()

    def _close(self) -> None:
        if self._elastic is not None:
            self._elastic.close()
        for thread in self._threads:
            thread.stop()
        self.reporter.close()

    # -- run.elastic's part of the run -------------------------------------------------------
    def _controls(self) -> list[str]:
        """What the dashboard may ask of this rank."""
        return [*CONTROLS, *(["settings"] if self._loaders else []),
                *(["elastic"] if self._elastic else [])]

    def _take_orders(self) -> None:
        """The dashboard's orders agreed at this step, carried out."""
        self._apply(self._agreed())

    def _enter_world(self, rank: int, world_size: int, group) -> None:
        """run.elastic(): this rank's place in a new world, and the group orders are agreed in."""
        self.rank, self.world_size = rank, world_size
        self._control, self._alone = Control(self._mailbox, rank, group), False
        self._control_off = False  # every member of a world ddptui formed reports
        for live in self._loaders:
            live.set_world(rank, world_size)

    def _position(self) -> dict:
        return {"global_step": self.global_step, "epoch": self._epoch,
                "epoch_step": self.global_step - self.figures.epoch_steps0,
                "consumed": [live.consumed for live in self._loaders]}

    def _leave(self, reason: str) -> NoReturn:
        """This rank leaves the world at an agreed step (s): it says so and exits with 0."""
        self._done = True
        self.figures.send_step(time.perf_counter(), self.global_step, self._taken_wait())
        self.reporter.emit("rank", state="stopped", reason=reason, pid=os.getpid())
        self._close()
        raise SystemExit(0)

    # -- inside --------------------------------------------------------------------------------
    def _announce(self) -> None:
        gpu = _physical_gpu()
        device = f"GPU {gpu}" if gpu is not None else "cpu"
        # A standby keeps the controls its slot had until run.elastic() says them again.
        standby = {"state": "standby"} if os.environ.get("DDPTUI_STANDBY") == "1" else \
            {"state": "running", "control": CONTROLS}
        self.reporter.emit("rank", pid=os.getpid(), device=device, gpu=gpu,
                           host=socket.gethostname(), api="ddptui.init", **standby)
        if self.rank == 0 and not self._supervised:  # under torchrun: attach learns the job
            self.reporter.emit("run", status="started", model=os.path.basename(sys.argv[0]),
                               script=" ".join(sys.argv), data="", epochs=0,
                               world_size=self.world_size,
                               device_kind="cuda" if device.startswith("GPU") else "cpu")
        for thread in self._threads:
            thread.start()

    def _say(self, text: str, level: str = "info", **fields) -> None:
        if self.rank == 0 or level != "info":
            self.reporter.emit("message", level=level, text=text, **fields)

    def _taken_wait(self) -> float:
        """The time the loop waited for run.loader() since the last call."""
        return self._loaders[0].take_wait() if self._loaders else 0.0

    def _settings_now(self) -> dict:
        return dict(self._loaders[0].settings) if self._loaders else {}

    def _end_epoch(self) -> None:
        if not self.active:  # run.epochs() without ddptui: nothing to report
            return
        self.figures.end_epoch(self.global_step, self._settings_now(), self.world_size,
                               self._taken_wait())

    def _agreed(self) -> list[dict]:
        """The dashboard's orders, the same on every rank at the same step."""
        if self._control_off:
            return []
        if self._control is None:
            group = None
            if self.world_size > 1 and dist.is_available() and dist.is_initialized():
                linked = every_rank_linked(self.world_size, lambda: self._mailbox.has_urgent)
                if not linked:  # None: a peer died; the recovery's world brings the control
                    self._control_off = linked is not None
                    if self._control_off:
                        self._say(CONTROL_OFF, "warning")
                    return []
                # A gloo group of our own: a few bytes every ~50 ms, never on the script's
                # NCCL streams. Created at the first step, which every rank reaches.
                group = dist.new_group(backend="gloo")
            self._control = Control(self._mailbox, self.rank, group)
            self._alone = group is None
            if self._alone and self.world_size > 1:  # no group to agree through: send us each
                self.reporter.emit("rank", state="running", alone=True)
        if self._alone:  # every step: look before draining (no exception raised per step)
            return self._mailbox.drain() if not self._mailbox.commands.empty() else []
        return self._control.poll()

    def _apply(self, cmds: list[dict]) -> None:
        for cmd in cmds:  # called every step: the table is the class's, built once
            handler = self._HANDLERS.get(cmd.get("op"))
            if handler is not None:  # resume outside a pause, or one this version lacks
                handler(self, cmd)

    def _checkpoint_asked(self, cmd: dict) -> None:
        self.should_checkpoint = True
        self._say(f"checkpoint asked for at step {self.global_step}")
        for fn in self._callbacks:
            fn()

    def _stop_asked(self, cmd: dict) -> None:
        self.should_stop = True
        self._say(f"stop asked for: ending the loop at step {self.global_step}")

    def _settings_asked(self, cmd: dict) -> None:
        if not self._loaders:
            return
        for live in self._loaders:
            live.pending.update(cmd["settings"])
        if self.rank == 0:
            first = self._loaders[0]
            self.reporter.emit("settings", settings={**first.settings, **first.pending},
                               epoch=(self._epoch or 0) + 1, status="pending",
                               request=cmd.get("request"))

    def _apply_asked(self, cmd: dict) -> None:
        for live in self._loaders:
            live.switch = bool(live.pending)

    def _applied(self, settings: dict, before: dict | None) -> None:
        """The first loader put new settings in force: at an epoch's start, or mid-epoch with
        `a` (`before` in force until then), which ends the row's part there on every rank."""
        f = self.figures
        if before is not None and f.open and self.global_step > f.segment_steps0:
            f.end_segment(self.global_step, True, before, self.world_size, self._taken_wait())
            f.begin_segment(self.global_step)
        if self.rank == 0:
            self.reporter.emit("settings", settings=settings, epoch=self._epoch or 0,
                               step=self._loaders[0].taken if before is not None else 0,
                               status="applied")

    def _pause(self, cmd: dict) -> None:
        """Every rank waits here, at the same step, until resumed (or stopped)."""
        if self.paused:
            return
        self.paused = True
        if self.rank == 0 or self._alone:  # alone, each rank pauses at a step of its own
            self.reporter.emit("run", status="paused", global_step=self.global_step)
        while self.paused:
            cmds = self._mailbox.drain() if self._alone else self._control.tick_paused()
            if self._alone:
                time.sleep(0.1)
            for cmd in cmds:
                if cmd.get("op") in ("resume", "stop"):
                    self.paused = False
            self._apply([c for c in cmds if c.get("op") not in ("pause", "resume")])
        if self.rank == 0 or self._alone:
            self.reporter.emit("run", status="resumed", global_step=self.global_step)
        self.figures.begin_interval()

    def _reform(self, cmd: dict) -> None:
        if self._elastic is not None and not self._mailbox.void(cmd):
            self._elastic.reform(cmd)

    _HANDLERS = {"pause": _pause, "checkpoint": _checkpoint_asked, "stop": _stop_asked,
                 "settings": _settings_asked, "apply": _apply_asked, "reform": _reform}


def _physical_gpu() -> int | None:
    if not torch.cuda.is_available():
        return None
    return physical_index(int(os.environ.get("LOCAL_RANK", 0)))


_RUN: list[Run] = []  # a process has one link to its dashboard, however often init() is called


def init(report: str | None = None) -> Run:
    """The run object for this rank: reports to `report` (HOST:PORT), else $DDPTUI_REPORT (set
    by `ddptui run SCRIPT`, or by you under torchrun for `ddptui attach`); without either, a
    run whose calls do nothing. Called again (a framework callback and the script), the same."""
    if not _RUN:
        _RUN.append(Run(report or os.environ.get("DDPTUI_REPORT") or None))
    return _RUN[0]


__all__ = ["Run", "init"]
