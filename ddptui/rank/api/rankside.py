"""The rank side of your own script as ddptui sees it: its place in the world, its link to the
dashboard and what it reports there. The public Run, its Orders and Elastic share it.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from typing import NoReturn

import torch

from ddptui.contract.channel import load_key, parse_address
from ddptui.contract.gpu import DeviceSampler, physical_index
from ddptui.contract.protocol import events
from ddptui.rank.api.figures import Figures
from ddptui.rank.elastic.control import Mailbox
from ddptui.rank.telemetry.remote import RemoteLink, node_name
from ddptui.rank.telemetry.reporter import Reporter
from ddptui.rank.wrap.spawned import JOINED

CONTROLS = ["pause", "checkpoint", "stop"]  # what the dashboard may ask of a script that steps


class RankSide:
    """The rank's position (rank, global step, epoch, its run.loader()s) and, with a dashboard to
    report to, its link: the reporter, the mailbox of orders and the step figures."""

    def __init__(self, report: str | None, interval: float):
        self.rank, self.world_size = _place()  # in the current world
        self.slot = self.rank  # the rank it was started as: its name on the dashboard
        self.active = bool(report)
        self.global_step = 0
        self.epoch: int | None = None
        self.loaders: list = []  # run.loader()'s, whose settings the dashboard steers
        self.resume: dict | None = None  # where a rank that joined a running world takes up
        self.finished = False
        if not self.active:
            return
        # Started by ddptui, or by a launcher ddptui started (mp.spawn): ddptui samples it.
        self.supervised = os.environ.get("DDPTUI_PARENT") == str(os.getppid()) or \
            JOINED in os.environ
        self.reporter = Reporter(self.slot)
        self.link = RemoteLink(parse_address(report, "DDPTUI_REPORT"), load_key()[0],
                               node_name(), lambda text: print(f"ddptui: rank {self.rank}: "
                                                               f"{text}", file=sys.stderr))
        self.reporter.sinks.append(self.link)
        self.mailbox = Mailbox(self.link.inbox)
        self.figures = Figures(self.reporter, interval)
        self._threads = [] if self.supervised else [DeviceSampler(
            self.reporter.rank, self.reporter.emit, lambda text: self.say(text, "warning"),
            physical_gpu())]

    def announce(self, standby: bool) -> None:
        """The rank's first event (and, under torchrun, the run's), and its samplers started."""
        gpu = physical_gpu()
        device = f"GPU {gpu}" if gpu is not None else "cpu"
        # A standby keeps the controls its slot had until run.elastic() says them again.
        state = {"state": "standby"} if standby else {"state": "running", "control": CONTROLS}
        self.reporter.emit(events.Rank(rank=self.reporter.rank, pid=os.getpid(), device=device, gpu=gpu,
                           host=socket.gethostname(), api="ddptui.init", **state))
        if self.rank == 0 and not self.supervised:  # under torchrun: attach learns the job
            self.reporter.emit(events.Run(rank=self.reporter.rank,
                                          status="started", model=os.path.basename(sys.argv[0]),
                               script=" ".join(sys.argv), data="", epochs=0,
                               world_size=self.world_size,
                               device_kind="cuda" if device.startswith("GPU") else "cpu"))
        for thread in self._threads:
            thread.start()

    def controls(self, elastic: bool) -> list[str]:
        """What the dashboard may ask of this rank."""
        return [*CONTROLS, *(["settings"] if self.loaders else []),
                *(["elastic"] if elastic else [])]

    def say(self, text: str, level: str = "info", kind: type[events.Notice] = events.Notice,
            **fields) -> None:
        """A line for the dashboard (rank 0's progress, every rank's warnings); `kind`: one
        that tells more, with its `fields` (a rollback)."""
        if self.rank == 0 or level != "info":
            self.reporter.emit(kind(rank=self.reporter.rank, level=level, text=text, **fields))

    def position(self) -> dict:
        """Where the run is: what a rollback point keeps and a joining rank takes up."""
        return {"global_step": self.global_step, "epoch": self.epoch,
                "epoch_step": self.global_step - self.figures.epoch_steps0,
                "consumed": [live.consumed for live in self.loaders]}

    def taken_wait(self) -> float:
        """The time the loop waited for run.loader() since the last call."""
        return self.loaders[0].take_wait() if self.loaders else 0.0

    def send_step(self) -> None:
        self.figures.send_step(time.perf_counter(), self.global_step, self.taken_wait())

    def end_epoch(self) -> None:
        if not self.active:  # run.epochs() without ddptui: nothing to report
            return
        settings = dict(self.loaders[0].settings) if self.loaders else {}
        self.figures.end_epoch(self.global_step, settings, self.world_size, self.taken_wait())

    def leave(self, reason: str) -> NoReturn:
        """This rank leaves the world at an agreed step (s): it says so and exits with 0."""
        self.finished = True
        self.send_step()
        self.reporter.emit(events.Rank(rank=self.reporter.rank,
                                       state="stopped", reason=reason, pid=os.getpid()))
        self.close()
        raise SystemExit(0)

    def close(self) -> None:
        for thread in self._threads:
            thread.stop()
        self.reporter.close()


def _place() -> tuple[int, int]:
    """(rank, world size): the process group's where one is formed (a rank mp.spawn started has
    its launcher's environment), else torchrun's variables."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def physical_gpu() -> int | None:
    if not torch.cuda.is_available():
        return None
    if JOINED in os.environ and torch.cuda.is_initialized():  # a launcher's rank: its own
        return physical_index(torch.cuda.current_device())
    return physical_index(int(os.environ.get("LOCAL_RANK", 0)))
