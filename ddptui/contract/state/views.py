"""What the screens show of one rank and one device: plain records the run state fills from
events and copies for every view. Pure Python."""

from __future__ import annotations

import bisect
import re
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from ddptui.contract.protocol.events import Gpu
from ddptui.contract.state.timeline import Recent
from ddptui.contract.states import RankState

GPU_HISTORY_S = 300.0  # the GPU charts' window: the last five minutes
STALE_S = 5.0  # readings come every 0.5 s: this much silence means none are coming
STEP_TIMES = 16  # a rank's recent step times, for its sparkline
CHANGES = 16  # a rank's changes of state kept
HEAT_S, HEAT_POINTS = 120.0, 2400  # the heat map's span, and the step events kept for it
# The metrics endpoint's step-time histogram, upper bounds in seconds (+Inf after).
# Log-spaced, about 3x apart: 10 ms to 30 s in 8 (512 ranks' scrape stays near 2 MB).
STEP_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


def _shallow(item):
    """A shallow copy: copy.copy's own way (__reduce_ex__) was 15 us, 512 of them a view."""
    out = object.__new__(type(item))
    out.__dict__.update(item.__dict__)
    return out


@dataclass
class RankView:
    rank: int
    state: RankState = RankState.STARTING
    pid: int | None = None
    device: str = ""
    gpu: int | None = None
    host: str = ""
    node: str = ""  # attach: the node it reports from (host and node rank)
    local_rank: int | None = None  # its rank on its node, where its launcher said
    epoch: int = 0
    step: int = 0
    global_step: int = 0
    loss: float | None = None
    samples_per_s: float = 0.0
    step_ms: float = 0.0
    data_wait: float = 0.0
    reason: str = ""
    last_step_t: float = 0.0
    progress: float = 0.0  # fraction of the epoch done, as the rank reported it
    iteration: bool = False  # a script that names no epochs: step counts its iterations
    steps_per_s: float = 0.0  # steps a second, from the steps a script printed
    state_t: float = 0.0  # when it entered its state
    standby: str = ""  # out of the world: its standby is warming | ready
    standby_t: float = 0.0
    stacks: str | None = None  # its Python stacks, last taken
    stacks_t: float = 0.0
    step_times: deque = field(default_factory=lambda: deque(maxlen=STEP_TIMES))  # ms
    # A script's rank, seen from outside (output and process events):
    last_line: str = ""
    status: str = ""  # its process: running, sleeping, stopped...
    cpu_percent: float | None = None
    rss: int | None = None  # MiB
    gpu_mem: int | None = None  # MiB
    error: list = field(default_factory=list)  # its traceback's last lines, when it failed
    control: list = field(default_factory=list)  # what a script rank said it takes
    # Since the run began, for the metrics endpoint (counters never go back):
    samples: float = 0.0
    step_counts: list = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))
    step_seconds: float = 0.0  # their sum
    ends: dict = field(default_factory=dict)  # crashed | stopped | done -> times
    restarts: int = 0
    # Its latest changes of state, (time, state, reason): a state held for less than a reader's
    # period (stalled, then killed at once) is still seen.
    changes: deque = field(default_factory=lambda: deque(maxlen=CHANGES))
    changed: int = 0  # changes of state so far (a reader takes those past its count)
    # (t, step ms) of its last HEAT_S of step events, for the heat map (read under the lock)
    step_line: deque = field(default_factory=lambda: deque(maxlen=HEAT_POINTS))

    def stepped(self, t: float, step_ms: float) -> None:
        """A step event's time and step time (0: a script's step read from its output, no time
        known), for the heat map."""
        self.step_line.append((t, step_ms))
        while self.step_line[0][0] < t - HEAT_S:
            self.step_line.popleft()

    def count(self, steps: int, step_ms: float, samples_per_s: float) -> None:
        """A step event's steps into the counters: each at the event's mean step time (a rolled
        up event's steps are only known by their mean)."""
        seconds = step_ms / 1000
        self.samples += samples_per_s * seconds * steps
        self.step_seconds += seconds * steps
        self.step_counts[bisect.bisect_left(STEP_BUCKETS, seconds)] += steps

    def entered(self, state: RankState, t: float, reason: str) -> None:
        """A new state: kept, and counted where it ends the process or brings it back."""
        self.changes.append((t, state, reason))
        self.changed += 1
        if state in (RankState.CRASHED, RankState.STOPPED, RankState.DONE):
            self.ends[state.value] = self.ends.get(state.value, 0) + 1
        elif state == RankState.RESTARTING:
            self.restarts += 1

    def copied(self) -> RankView:
        """For a view: what changes in place copied (a reader holds it after the lock); a
        shallow copy, not dataclasses.replace (its __init__ was a third of a 512-rank view)."""
        out = _shallow(self)
        out.step_times, out.step_counts = deque(self.step_times), list(self.step_counts)
        out.ends, out.changes = dict(self.ends), deque(self.changes)
        return out

    def order(self) -> tuple:
        """Ranks grouped by the node they report from under attach ('host/2' before 'host/10'),
        then by rank; on one box, by rank (a row never moves as its details arrive)."""
        return (*(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", self.node)), self.rank)


@dataclass
class DeviceView:
    """One GPU (by physical index), or one CPU rank's process tree."""

    key: str
    rank: int
    util: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    cpu_percent: float | None = None
    rss: int | None = None
    sm_clock: int | None = None
    mem_clock: int | None = None
    held_down: list = field(default_factory=list)  # NVML clock-event reasons in force
    others: list = field(default_factory=list)  # [pid, MiB, user, name] not of the run
    pcie_tx: float | None = None  # MB/s
    pcie_rx: float | None = None
    nvlink_tx: float | None = None
    nvlink_rx: float | None = None
    uuid: str | None = None  # as nvidia-smi shows it
    seen_t: float = 0.0  # time of the last reading
    age: float = 0.0  # set in views: seconds since that reading
    stale: bool = False  # set in views: no reading for a while, or the run is over
    # (t, util or CPU%, memory %, power W) over the last minutes; a list in views
    history: Recent | list = field(default_factory=lambda: Recent(GPU_HISTORY_S))

    def take(self, ev: Gpu) -> None:
        """A reading of this device; a figure it does not give keeps its last value."""
        self.rank, self.seen_t = ev.rank, ev.t
        for name in ("util", "mem_used", "mem_total", "power_w", "temp_c", "cpu_percent", "rss",
                     "sm_clock", "mem_clock", "held_down", "others", "pcie_tx", "pcie_rx",
                     "nvlink_tx", "nvlink_rx", "uuid"):
            if getattr(ev, name) is not None:
                setattr(self, name, getattr(ev, name))
        mem = 100 * self.mem_used / self.mem_total if self.mem_used is not None and self.mem_total \
            else None
        if isinstance(self.history, Recent):  # a view's copy is a plain list: it takes nothing
            self.history.add(ev.t, self.util if self.util is not None else self.cpu_percent, mem,
                             self.power_w)

    def copied(self) -> DeviceView:
        """For views: its history copied (a reader holds it after the lock)."""
        out = _shallow(self)
        out.history = self.history.copy()
        return out

    def aged(self, now: float, over: bool) -> DeviceView:
        """A view's copy of a copy, stale once its readings stopped or the run is `over` (a
        finished run's last reading, a GPU at 100%, must not read as the present)."""
        out = _shallow(self)
        out.age, out.stale = max(0.0, now - self.seen_t), over or now - self.seen_t > STALE_S
        return out

    def order(self) -> tuple[int, str, int]:
        """GPUs before CPU ranks, then by node and number."""
        node, _, name = self.key.rpartition(" ")
        digits = "".join(c for c in name if c.isdigit())
        return (0 if name.startswith("gpu") else 1, node, int(digits or 0))


class Progress(NamedTuple):
    """Where the run is, from the member furthest on."""

    epoch: int
    epochs: int
    step: int  # within the epoch
    steps: int  # per epoch (0: not known)
    done: float  # fraction of the run

    @property
    def where(self) -> str:
        """'epoch 2 of 0-4': epochs count from 0 everywhere (events, tables, lines, CSV), as
        PyTorch's samplers and the frameworks count them, so the last of 5 is epoch 4."""
        return f"epoch {self.epoch}" + (f" of 0-{self.epochs - 1}" if self.epochs else "")


@dataclass
class Vitals:
    """The few live figures a controller polls often (the autotuner, the keys)."""

    status: str  # starting | running | done | failed | interrupted
    paused: bool
    pause_asked: bool | None  # space pressed and the ranks not there yet: what was asked
    settings: dict  # in force
    pending: dict  # asked for, applied at the next epoch (or at `a`)
    throughput: float  # img/s of the members with fresh figures


@dataclass
class RunView(Vitals):
    """A consistent copy of everything the screens draw, taken under the run state's lock."""

    meta: dict  # model, data, epochs, world_size, device_kind, log, script...
    elapsed: float  # s since launch
    now: float  # the run's clock: wall time live, the last event's time in a replay
    ranks: list[RankView]
    devices: list[DeviceView]
    epochs: list[dict]  # finished epoch rows, merged over ranks (an `epoch` event's fields)
    live_epoch: dict | None  # the epoch now running, as a row
    best_val_acc: float | None
    progress: Progress
    exit_code: int | None
    reason: str  # why it failed or stopped
    checkpoint_t: float | None  # when the last checkpoint was written
    host: dict  # the host's CPU and memory (CPU runs)


def progress_of(ranks: list[RankView], meta: dict, status: str) -> Progress:
    """Epoch, step and the fraction of the run done, from the member furthest on; the fraction
    comes from the ranks' own sampler, so it stays right when a smaller world takes more steps
    per epoch."""
    r = max(ranks, key=lambda r: (r.global_step, -r.rank)) if ranks else RankView(0)
    epochs = int(meta.get("epochs") or 0)
    done = min(1.0, (r.epoch + min(r.progress, 1.0)) / epochs) if epochs else 0.0
    if status == "done":
        done = 1.0
    return Progress(r.epoch, epochs, r.step, int(meta.get("steps_per_epoch") or 0), done)


FRESH_S = 5.0  # a rank's throughput counts toward the total while this recent ...
FRESH_STEPS = 3  # ... or for this many of its steps, whichever is longer


def throughput(ranks, now: float) -> float:
    """The members' latest rates while they are fresh: a rank's figure counts for a few of its
    own steps (a 1.4 s step is not 0 img/s), never after its steps stopped coming."""
    return sum(r.samples_per_s for r in ranks if r.state.is_stepping and
               now - r.last_step_t < max(FRESH_S, FRESH_STEPS * r.step_ms / 1000))
