"""The device sampler of a rank that no ddptui parent watches (torchrun or srun, with --report or
--log): a daemon thread that reports its own device a few times a second.

Under `ddptui run` the parent samples every GPU of the run instead. GPU ranks read NVML for
their physical GPU; CPU ranks (and GPU ranks whose NVML fails) report the process tree's CPU%
and RSS from psutil. A failure is said once and the run goes on.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable

import psutil

from ddptui.contract.protocol.events import Gpu


def physical_index(local_rank: int) -> int | None:
    """The NVML (nvidia-smi) index of this process's GPU `local_rank`, through
    CUDA_VISIBLE_DEVICES; None where that names the GPU otherwise (a UUID, MIG)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return local_rank
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    return int(ids[local_rank]) if local_rank < len(ids) and ids[local_rank].isdigit() else None

class DeviceSampler(threading.Thread):
    """Calls record(Gpu(...)) for rank `rank` every `interval` seconds until stopped."""

    def __init__(self, rank: int, record: Callable[[Gpu], None], warn: Callable[[str], None],
                 physical_gpu: int | None, interval: float = 0.5):
        super().__init__(name="device-sampler", daemon=True)
        self.rank, self.record, self.warn = rank, record, warn
        self.physical_gpu = physical_gpu
        self.interval = interval
        self._halt = threading.Event()
        self._tree = ProcessTree()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        nvml = self._open_nvml() if self.physical_gpu is not None else None
        self._tree.read(os.getpid())  # psutil's first reading is meaningless; prime it
        while not self._halt.wait(self.interval):
            if nvml is not None:
                try:
                    self.record(Gpu(rank=self.rank, **nvml()))
                    continue
                except Exception as e:  # a GPU fallen off the bus must not stop training
                    self.warn(f"NVML reading failed, reporting CPU figures instead: {e}")
                    nvml = None
            cpu, rss = self._tree.read(os.getpid())
            self.record(Gpu(rank=self.rank, gpu=self.physical_gpu, cpu_percent=cpu, rss=rss))

    def _open_nvml(self) -> Callable[[], dict] | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.physical_gpu)
        except Exception as e:
            self.warn(f"NVML unavailable for GPU {self.physical_gpu}, reporting CPU figures: {e}")
            return None
        gpu = self.physical_gpu
        uuid = gpu_uuid(pynvml, handle)
        readings = itertools.count()

        def read() -> dict:
            mem = memory_info(pynvml, handle)
            return {
                "gpu": gpu,
                "uuid": uuid or None if next(readings) % UUID_EVERY == 0 else None,
                "util": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                "mem_used": mem.used >> 20,
                "mem_total": mem.total >> 20,
                "power_w": round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1),
                "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            }

        return read


class ProcessTree:
    """CPU% and RSS of a process with its children (DataLoader workers). It keeps the Process
    objects between readings: psutil's cpu_percent() measures since the same object's last call,
    so the first reading of a process is 0."""

    def __init__(self):
        self._known: dict[int, psutil.Process] = {}

    def process(self, pid: int) -> psutil.Process | None:
        if pid not in self._known:
            try:
                self._known[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return self._known[pid]

    def read(self, pid: int) -> tuple[float, int]:
        """(CPU% summed over the tree, RSS in MiB)."""
        root = self.process(pid)
        if root is None:
            return 0.0, 0
        try:
            members = [root] + [self.process(c.pid) for c in root.children(recursive=True)]
        except psutil.Error:
            members = [root]
        cpu, rss = 0.0, 0
        for p in members:
            try:
                cpu += p.cpu_percent()
                rss += p.memory_info().rss
            except (psutil.Error, AttributeError):  # ended between the listing and the read
                pass
        return round(cpu, 1), rss >> 20

    def forget(self) -> None:
        """Drop processes that are gone (psutil tells a reused pid apart by its start time)."""
        self._known = {pid: p for pid, p in self._known.items() if p.is_running()}


UUID_EVERY = 120  # readings: a GPU's UUID in its first, then once a minute (a log read later)


def gpu_uuid(pynvml, handle) -> str:
    """The GPU's UUID as nvidia-smi shows it (GPU-...); '' where NVML will not say."""
    try:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
    except Exception:  # an old driver, a MIG slice: the figures go on without it
        return ""
    return uuid.decode() if isinstance(uuid, bytes) else uuid


def memory_info(pynvml, handle):
    """Used memory as nvidia-smi counts it: the v2 reading leaves the driver's reservation out
    (v1 counted ~600 MiB on an idle H200). Drivers without v2 fall back to v1."""
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except (AttributeError, TypeError, pynvml.NVMLError):
        return pynvml.nvmlDeviceGetMemoryInfo(handle)
