"""The parent's sampler: every GPU of the run through NVML whatever state its rank is in, each CPU
rank's process tree and the host through psutil, and what a rank's process is doing right now.

It reads from outside and never touches the ranks: no rank samples NVML under `ddptui run`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

from ddptui.contract.gpu import UUID_EVERY, ProcessTree
from ddptui.contract.nvml import open_nvml
from ddptui.contract.protocol.events import Gpu

SAMPLE_EVERY_S = 0.5  # GPU and process readings of a run's ranks, built-in or script


class RunSampler:
    """sample() emits one `gpu` event per GPU of the run (or per CPU rank); host() and
    process() answer the supervisor's questions about the machine and a rank's process."""

    def __init__(self, gpus: list[int] | None, emit: Callable[[Gpu], None],
                 warn: Callable[[str], None]):
        self.gpus = list(gpus or [])
        self.emit, self.warn = emit, warn
        self.nvml = open_nvml() if self.gpus else None
        if self.gpus and self.nvml is None:
            warn("NVML is not available: no GPU figures (training is not affected)")
        self.util: dict[int, float] = {}  # GPU -> its latest utilisation
        self._tree = ProcessTree()
        self._traffic: dict[int, tuple[float, dict]] = {}  # GPU -> (time, byte counters)
        self._readings: dict[int, int] = {}  # GPU -> readings sent
        self._owners: dict[int, tuple[str, str]] = {}  # pid -> (user, name)
        self.gpu_memory: dict[int, int] = {}  # pid -> MiB it holds on the run's GPUs
        self.gpus_of: dict[int, set[int]] = {}  # pid -> the run's GPUs it holds memory on

    def sample(self, slots: dict[int, tuple[int | None, int | None]], run_pids: set[int]) -> None:
        """`slots`: rank slot -> (pid, GPU) of its current process; `run_pids`: every process of
        the run (so that the others on a GPU can be named)."""
        if self.nvml is not None:
            self._sample_gpus(slots, run_pids)
        elif not self.gpus:
            for slot, (pid, _gpu) in slots.items():
                if pid:
                    cpu, rss = self._tree.read(pid)
                    self.emit(Gpu(rank=slot, gpu=None, cpu_percent=cpu, rss=rss))

    def _sample_gpus(self, slots, run_pids: set[int]) -> None:
        owner = {gpu: slot for slot, (_pid, gpu) in slots.items() if gpu is not None}
        memory: dict[int, int] = {}
        held: dict[int, set[int]] = {}
        for gpu in self.gpus:
            try:
                info = self.nvml.read(gpu)
            except Exception as e:  # a GPU fallen off the bus must not stop the run
                self.warn(f"NVML reading of GPU {gpu} failed, no more GPU figures: {e}")
                self.nvml.close()
                self.nvml = None
                return
            self.util[gpu] = info.util
            for pid, _name, mib in info.processes:
                memory[pid] = memory.get(pid, 0) + mib
                held.setdefault(pid, set()).add(gpu)
            others = [[pid, mib, *self._owner(pid)] for pid, _name, mib in info.processes
                      if pid not in run_pids]
            said = self._readings[gpu] = self._readings.get(gpu, -1) + 1
            self.emit(Gpu(rank=owner.get(gpu, min(owner.values(), default=0)), others=others,
                          uuid=info.uuid or None if said % UUID_EVERY == 0 else None,
                          **info.event_fields(), **self._rates(gpu, info)))
        self.gpu_memory, self.gpus_of = memory, held

    def _rates(self, gpu: int, info) -> dict:
        """MB/s over PCIe and NVLink since the last reading, from NVML's byte counters."""
        now, before = time.monotonic(), self._traffic.get(gpu)
        self._traffic[gpu] = (now, info.traffic)
        if before is None or now <= before[0]:
            return {}
        seconds, old = now - before[0], before[1]
        return {name: round(max(0, count - old[name]) / seconds / 1e6, 1)
                for name, count in info.traffic.items() if name in old}

    def _owner(self, pid: int) -> tuple[str, str]:
        """(user, name) of a process on a GPU that is not ours; asked once per pid."""
        if pid not in self._owners:
            if len(self._owners) > 1000:  # a long run on a busy shared machine
                self._owners.clear()
            try:
                p = psutil.Process(pid)
                self._owners[pid] = (p.username(), p.name())
            except psutil.Error:  # gone, or in a container NVML sees into and we do not
                self._owners[pid] = ("?", "?")
        return self._owners[pid]

    def host(self) -> dict:
        mem = psutil.virtual_memory()
        return {"cpu_percent": psutil.cpu_percent(), "mem_percent": mem.percent,
                "mem_used": (mem.total - mem.available) >> 20, "mem_total": mem.total >> 20,
                "cpus": psutil.cpu_count()}

    def process(self, pid: int | None) -> tuple[str, float]:
        """(psutil status: running, sleeping, stopped, disk-sleep, zombie...; CPU% of the
        process alone) for a rank's main process."""
        p = self._tree.process(pid) if pid else None
        if p is None:
            return "gone", 0.0
        try:
            return p.status(), round(p.cpu_percent(), 1)
        except psutil.Error:
            return "gone", 0.0

    def forget(self) -> None:
        """Nothing kept of the processes that ended since."""
        self._tree.forget()

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
