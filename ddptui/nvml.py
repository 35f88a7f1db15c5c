"""What NVML sees on this host, for `ddptui gpus` and for checking --gpus before any rank starts.

Only nvidia-ml-py (pynvml): no torch, no CUDA context. nvidia-smi order (PCI bus id).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuInfo:
    index: int
    name: str
    mem_used: int  # MiB
    mem_total: int
    util: int
    processes: list = field(default_factory=list)  # (pid, name, MiB)


def gpu_count() -> int:
    """How many GPUs NVML sees; 0 where there is no NVIDIA driver or library."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def list_gpus() -> list[GpuInfo]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        import psutil

        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            info = GpuInfo(i, name.decode() if isinstance(name, bytes) else name,
                           mem.used >> 20, mem.total >> 20,
                           pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            try:
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    try:
                        pname = psutil.Process(p.pid).name()
                    except psutil.Error:
                        pname = "?"
                    info.processes.append((p.pid, pname, (p.usedGpuMemory or 0) >> 20))
            except pynvml.NVMLError:
                pass
            found.append(info)
        return found
    finally:
        pynvml.nvmlShutdown()


def format_gpus(gpus: list[GpuInfo]) -> str:
    if not gpus:
        return "no NVIDIA GPU found"
    lines = [f"{'GPU':>3}  {'name':<28} {'memory':>17}  {'util':>4}  processes"]
    for g in gpus:
        procs = ", ".join(f"{pid} {name} {mib} MiB" for pid, name, mib in g.processes) or "-"
        lines.append(f"{g.index:>3}  {g.name[:28]:<28} {g.mem_used:>7}/{g.mem_total:<6} MiB"
                     f"  {g.util:>3}%  {procs}")
    return "\n".join(lines)
