"""What NVML's traffic counters read on this machine: two readings a second apart per GPU, the
rates ddptui derives from them, beside nvmlDeviceGetPcieThroughput for comparison."""

import time

import pynvml

from ddptui.nvml import Nvml

nvml = Nvml()
for i in range(nvml.count()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    a = nvml.read(i)
    time.sleep(1.0)
    b = nvml.read(i)
    rates = {k: (b.traffic[k] - a.traffic[k]) / 1e6 for k in b.traffic if k in a.traffic}
    try:
        pcie = [pynvml.nvmlDeviceGetPcieThroughput(h, c) for c in (0, 1)]
    except pynvml.NVMLError as e:
        pcie = str(e)
    print(i, a.name, "counters", b.traffic, "MB/s", rates, "PcieThroughput KB/s", pcie,
          "clocks", b.sm_clock, b.mem_clock, flush=True)
nvml.close()
