"""What the screens show of one rank and one device: plain records the run state fills from
events and copies for every view. Pure Python."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ddptui.timeline import Recent

GPU_HISTORY_S = 300.0  # the GPU charts' window: the last five minutes
STEP_TIMES = 16  # a rank's recent step times, for its sparkline


@dataclass
class RankView:
    rank: int
    state: str = "starting"
    pid: int | None = None
    device: str = ""
    gpu: int | None = None
    host: str = ""
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
    seen_t: float = 0.0  # time of the last reading
    age: float = 0.0  # set in views: seconds since that reading
    stale: bool = False  # set in views: no reading for a while, or the run is over
    # (t, util or CPU%, memory %, power W) over the last minutes; a list in views
    history: Recent | list = field(default_factory=lambda: Recent(GPU_HISTORY_S))
