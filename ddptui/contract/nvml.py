"""What NVML sees on this host: one reading per GPU, for the run's sampler, `ddptui gpus` and the
check of --gpus before any rank starts.

Only nvidia-ml-py (pynvml): no torch, no CUDA context. nvidia-smi order (PCI bus id). Memory is
NVML's v2 reading, so `used` excludes the driver's reserved memory, as nvidia-smi shows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptui.contract.gpu import gpu_uuid, memory_info

# Cumulative byte counters read as NVML field values: (field, scope, unit in bytes). NVLink's are
# summed over all links (scope 0xFFFFFFFF); a GPU or driver without one simply leaves it out.
TRAFFIC = {
    "pcie_tx": ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0, 1),
    "pcie_rx": ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0, 1),
    "nvlink_tx": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 0xFFFFFFFF, 1024),
    "nvlink_rx": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 0xFFFFFFFF, 1024),
}

# NVML clock-event reasons that mean "held down", by the names a user would look up.
HELD_DOWN = {
    "nvmlClocksEventReasonSwPowerCap": "power cap",
    "nvmlClocksEventReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksEventReasonHwThermalSlowdown": "thermal (hardware)",
    "nvmlClocksEventReasonSwThermalSlowdown": "thermal",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "power brake",
}


@dataclass
class GpuInfo:
    index: int
    name: str
    mem_used: int  # MiB
    mem_total: int
    util: int
    power_w: float = 0.0
    temp_c: int = 0
    sm_clock: int = 0  # MHz
    mem_clock: int = 0
    held_down: list = field(default_factory=list)  # clock-event reasons in force
    processes: list = field(default_factory=list)  # (pid, name, MiB)
    traffic: dict = field(default_factory=dict)  # counter name -> bytes so far (see TRAFFIC)
    uuid: str = ""  # as nvidia-smi shows it, GPU-...

    def event_fields(self) -> dict:
        """The fields of a `gpu` event."""
        return {"gpu": self.index, "util": self.util, "mem_used": self.mem_used,
                "mem_total": self.mem_total, "power_w": self.power_w, "temp_c": self.temp_c,
                "sm_clock": self.sm_clock, "mem_clock": self.mem_clock,
                "held_down": list(self.held_down)}


class Nvml:
    """An open NVML session; read(i) gives GPU i now. Closing ends the session."""

    def __init__(self):
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        self._handles: dict[int, object] = {}
        self._uuids: dict[int, str] = {}
        # The traffic counters this nvidia-ml-py knows: name -> (field id, scope, unit).
        self._traffic_fields = {name: (getattr(pynvml, fid), scope, unit)
                                for name, (fid, scope, unit) in TRAFFIC.items()
                                if hasattr(pynvml, fid)}

    def count(self) -> int:
        return self.nvml.nvmlDeviceGetCount()

    def read(self, index: int, processes: bool = True) -> GpuInfo:
        n = self.nvml
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = n.nvmlDeviceGetHandleByIndex(index)
        mem = memory_info(n, h)
        info = GpuInfo(index, _text(n.nvmlDeviceGetName(h)),
                       mem.used >> 20, mem.total >> 20, n.nvmlDeviceGetUtilizationRates(h).gpu)
        info.power_w = _optional(lambda: round(n.nvmlDeviceGetPowerUsage(h) / 1000, 1), 0.0)
        info.temp_c = _optional(lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU), 0)
        info.sm_clock = _optional(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM), 0)
        info.mem_clock = _optional(lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM), 0)
        reasons = _optional(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h), 0)
        info.held_down = [label for name, label in HELD_DOWN.items()
                          if reasons & getattr(n, name, 0)]
        if processes:
            info.processes = [(pid, "", mib) for pid, mib in self._processes(h)]
        info.traffic = self._traffic(h)
        info.uuid = self._uuids.get(index) or self._uuids.setdefault(index, gpu_uuid(n, h))
        return info

    def _traffic(self, h) -> dict:
        n, wanted = self.nvml, self._traffic_fields
        try:
            values = n.nvmlDeviceGetFieldValues(h, [(fid, scope) for fid, scope, _ in
                                                    wanted.values()])
        except Exception:  # an old driver: no such call, or none of these fields
            return {}
        return {name: v.value.ullVal * unit for (name, (_, _, unit)), v in
                zip(wanted.items(), values, strict=True) if v.nvmlReturn == n.NVML_SUCCESS}

    def _processes(self, h) -> list[tuple[int, int]]:
        try:
            found = self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
        except self.nvml.NVMLError:
            return []
        return [(p.pid, (p.usedGpuMemory or 0) >> 20) for p in found]

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # already shut down: nothing to release
            pass


def _text(value) -> str:
    """NVML's strings: bytes from older nvidia-ml-py."""
    return value.decode() if isinstance(value, bytes) else value


def _optional(read, default):
    """A figure some GPUs do not report (power on some boards, clocks under MIG)."""
    try:
        return read()
    except Exception:
        return default


def open_nvml() -> Nvml | None:
    """An NVML session, or None where there is no NVIDIA driver or library."""
    try:
        return Nvml()
    except Exception:
        return None


def gpu_count() -> int:
    """How many GPUs NVML sees; 0 where there is no NVIDIA driver or library."""
    nvml = open_nvml()
    if nvml is None:
        return 0
    try:
        return nvml.count()
    finally:
        nvml.close()


def list_gpus() -> list[GpuInfo]:
    nvml = open_nvml()
    if nvml is None:
        return []
    try:
        import psutil

        found = [nvml.read(i) for i in range(nvml.count())]
        for info in found:
            info.processes = [(pid, _process_name(psutil, pid), mib)
                              for pid, _, mib in info.processes]
        return found
    finally:
        nvml.close()


def _process_name(psutil, pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def format_gpus(gpus: list[GpuInfo]) -> str:
    if not gpus:
        return "no NVIDIA GPU found"
    lines = [f"{'GPU':>3}  {'name':<28} {'memory':>17}  {'util':>4}  {'power':>6}  {'temp':>4}  "
             "processes"]
    for g in gpus:
        procs = ", ".join(f"{pid} {name} {mib} MiB" for pid, name, mib in g.processes) or "-"
        lines.append(f"{g.index:>3}  {g.name[:28]:<28} {g.mem_used:>7}/{g.mem_total:<6} MiB"
                     f"  {g.util:>3}%  {g.power_w:>5.0f}W  {g.temp_c:>3}C  {procs}")
    return "\n".join(lines)
