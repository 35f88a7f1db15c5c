"""--tensorboard DIR: the telemetry's scalars also written as TensorBoard event files, one per
rank in DIR (TensorBoard merges them) or one for a script's whole run (written by the parent):
loss, img/s, data-wait, GPU load, epoch metrics. TensorBoard's own writer: no torch needed.
"""

from __future__ import annotations


class TensorBoardSink:
    """Takes every event a rank emits (from the loop and the device sampler thread), or every
    event of a script's run in the parent."""

    def __init__(self, log_dir: str, suffix: str):
        # The tensorboard package's writer and protos, as torch's SummaryWriter uses them.
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self.writer = EventFileWriter(log_dir, filename_suffix=suffix)
        self.samples = 0  # device samples so far: their step axis

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        self.writer.add_event(self._event(summary=summary, step=int(step),
                                          wall_time=walltime or 0.0))

    def put(self, ev: dict) -> None:
        rank, t = ev["rank"], ev.get("t")
        add = self.add_scalar
        match ev:
            case {"kind": "step"}:
                step = ev.get("global_step", 0)
                if ev.get("loss") is not None:
                    add(f"loss/rank{rank}", ev["loss"], step, walltime=t)
                if ev.get("source") != "output":  # a script's printed loss says nothing of rates
                    add(f"img_per_s/rank{rank}", ev.get("samples_per_s", 0.0), step, walltime=t)
                    add(f"data_wait/rank{rank}", ev.get("data_wait", 0.0), step, walltime=t)
            case {"kind": "gpu"}:
                self.samples += 1
                if ev.get("util") is not None:
                    add(f"gpu_util/gpu{ev['gpu']}", ev["util"], self.samples, walltime=t)
                    add(f"gpu_mem_mib/gpu{ev['gpu']}", ev.get("mem_used", 0), self.samples,
                        walltime=t)
                elif ev.get("cpu_percent") is not None:
                    add(f"cpu_percent/rank{rank}", ev["cpu_percent"], self.samples, walltime=t)
            case {"kind": "epoch"} if not ev.get("partial") or ev.get("at_step") is not None:
                self._epoch(ev, rank, t)

    def _epoch(self, ev: dict, rank: int, t: float | None) -> None:
        """An epoch, or an iteration-based script's evaluation (its axis: the iteration)."""
        epoch = ev["epoch"] if ev.get("at_step") is None else ev["at_step"]
        if ev.get("source") != "output":
            self.add_scalar(f"epoch_img_per_s/rank{rank}", ev.get("samples_per_s", 0.0), epoch,
                            walltime=t)
        if rank == 0:
            for name in ("train_loss", "val_loss", "val_acc"):
                if ev.get(name) is not None:
                    self.add_scalar(name, ev[name], epoch, walltime=t)
            for name, value in (ev.get("metrics") or {}).items():
                if isinstance(value, (int, float)):
                    self.add_scalar(name, value, epoch, walltime=t)

    def close(self) -> None:
        self.writer.close()
