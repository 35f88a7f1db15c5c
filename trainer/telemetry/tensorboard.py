"""--tensorboard DIR: the telemetry's scalars also written with torch's SummaryWriter, one event
file per rank in DIR (TensorBoard merges them): loss, img/s, data-wait, GPU load, val metrics.
"""

from __future__ import annotations


class TensorBoardSink:
    """Takes every event a rank emits (from the loop and the device sampler thread)."""

    def __init__(self, log_dir: str, rank: int):
        from torch.utils.tensorboard import SummaryWriter  # optional extra: checked by config

        self.writer = SummaryWriter(log_dir=log_dir, filename_suffix=f".rank{rank}")
        self.samples = 0  # device samples so far: their step axis

    def put(self, ev: dict) -> None:
        kind, rank, t = ev["kind"], ev["rank"], ev.get("t")
        add = self.writer.add_scalar
        if kind == "step":
            step = ev.get("global_step", 0)
            if ev.get("loss") is not None:
                add(f"loss/rank{rank}", ev["loss"], step, walltime=t)
            add(f"img_per_s/rank{rank}", ev.get("samples_per_s", 0.0), step, walltime=t)
            add(f"data_wait/rank{rank}", ev.get("data_wait", 0.0), step, walltime=t)
        elif kind == "gpu":
            self.samples += 1
            if ev.get("util") is not None:
                add(f"gpu_util/gpu{ev['gpu']}", ev["util"], self.samples, walltime=t)
                add(f"gpu_mem_mib/gpu{ev['gpu']}", ev.get("mem_used", 0), self.samples, walltime=t)
            elif ev.get("cpu_percent") is not None:
                add(f"cpu_percent/rank{rank}", ev["cpu_percent"], self.samples, walltime=t)
        elif kind == "epoch" and not ev.get("partial"):
            epoch = ev["epoch"]
            add(f"epoch_img_per_s/rank{rank}", ev.get("samples_per_s", 0.0), epoch, walltime=t)
            if rank == 0:
                for name in ("train_loss", "val_loss", "val_acc"):
                    if ev.get(name) is not None:
                        add(name, ev[name], epoch, walltime=t)

    def close(self) -> None:
        self.writer.close()
