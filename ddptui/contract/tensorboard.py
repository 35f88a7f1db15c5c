"""--tensorboard DIR: the telemetry's scalars also written as TensorBoard event files, one per
rank in DIR (TensorBoard merges them) or one for a script's whole run (written by the parent):
loss, img/s, data-wait, GPU load, epoch metrics. TensorBoard's own writer: no torch needed.
"""

from __future__ import annotations

from ddptui.contract.protocol.events import Epoch, Event, Gpu, Step


class TensorBoardSink:
    """Takes every event a rank emits (from the loop and the device sampler thread), or every
    event of a script's run in the parent."""

    def __init__(self, log_dir: str, suffix: str):
        # The tensorboard package's writer and protos, as torch's SummaryWriter uses them.
        from tensorboard.compat.proto.event_pb2 import Event as TbEvent
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = TbEvent, Summary
        self.writer = EventFileWriter(log_dir, filename_suffix=suffix)
        self.samples = 0  # device samples so far: their step axis

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        self.writer.add_event(self._event(summary=summary, step=int(step),
                                          wall_time=walltime or 0.0))

    def put(self, ev: Event) -> None:
        rank, t = ev.rank, ev.t
        add = self.add_scalar
        match ev:
            case Step():
                if ev.loss is not None:
                    add(f"loss/rank{rank}", ev.loss, ev.global_step, walltime=t)
                if ev.source != "output":  # a script's printed loss says nothing of rates
                    add(f"img_per_s/rank{rank}", ev.samples_per_s or 0.0, ev.global_step,
                        walltime=t)
                    add(f"data_wait/rank{rank}", ev.data_wait or 0.0, ev.global_step, walltime=t)
            case Gpu():
                self.samples += 1
                if ev.util is not None:
                    add(f"gpu_util/gpu{ev.gpu}", ev.util, self.samples, walltime=t)
                    add(f"gpu_mem_mib/gpu{ev.gpu}", ev.mem_used or 0, self.samples, walltime=t)
                elif ev.cpu_percent is not None:
                    add(f"cpu_percent/rank{rank}", ev.cpu_percent, self.samples, walltime=t)
            case Epoch() if not ev.partial or ev.at_step is not None:
                self._epoch(ev, rank, t)

    def _epoch(self, ev: Epoch, rank: int, t: float | None) -> None:
        """An epoch, or an iteration-based script's evaluation (its axis: the iteration)."""
        epoch = ev.epoch if ev.at_step is None else ev.at_step
        if ev.source != "output":
            self.add_scalar(f"epoch_img_per_s/rank{rank}", ev.samples_per_s, epoch, walltime=t)
        if rank == 0:
            for name in ("train_loss", "val_loss", "val_acc"):
                if getattr(ev, name) is not None:
                    self.add_scalar(name, getattr(ev, name), epoch, walltime=t)
            for name, value in (ev.metrics or {}).items():
                if isinstance(value, (int, float)):
                    self.add_scalar(name, value, epoch, walltime=t)

    def close(self) -> None:
        self.writer.close()
