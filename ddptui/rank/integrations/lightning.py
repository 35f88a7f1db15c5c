"""DdptuiCallback for PyTorch Lightning: `Trainer(strategy="ddp", callbacks=[DdptuiCallback()])`
under `ddptui run train.py` (Lightning takes the launch for torchrun's and spawns nothing) or
under torchrun with DDPTUI_REPORT for `ddptui attach`.

Every rank reports its own loss and samples per step (before any reduction, without a device
sync), each epoch's row carries the metrics Lightning logged (val_loss, val_acc...), and the
dashboard's c, q and space reach every rank at the same step: c saves Lightning's own checkpoint
(trainer.save_checkpoint, on every rank as it needs), q sets trainer.should_stop, space pauses.
"""

from __future__ import annotations

import os

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

import ddptui
from ddptui.rank.prefetch import tensors_of


class DdptuiCallback(Callback):
    """Add it to the Trainer's callbacks; it does nothing where ddptui is not around."""

    def __init__(self, checkpoint_dir: str | None = None):
        """`checkpoint_dir`: where c saves (default: the ModelCheckpoint's folder, else
        default_root_dir/checkpoints)."""
        self.checkpoint_dir = checkpoint_dir
        self.run = None
        self.saved: list[str] = []  # the checkpoints c wrote, on rank 0

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.run is None:
            self.run = ddptui.init()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.run.epoch(trainer.current_epoch)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        found = tensors_of(batch)
        self.run.step(loss, samples=len(found[0]) if found and found[0].dim() else 0)
        if self.run.should_checkpoint:
            self._save(trainer)
        if self.run.should_stop:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.run.log(**{name: value for name, value in trainer.callback_metrics.items()
                        if getattr(value, "numel", lambda: 1)() == 1})

    def on_fit_end(self, trainer, pl_module) -> None:
        self.run.done()

    def _save(self, trainer) -> None:
        folder = self.checkpoint_dir or getattr(trainer.checkpoint_callback, "dirpath", None) \
            or os.path.join(trainer.default_root_dir, "checkpoints")
        path = os.path.join(folder, f"ddptui-epoch={trainer.current_epoch}-"
                                    f"step={trainer.global_step}.ckpt")
        trainer.save_checkpoint(path)  # every rank calls it: Lightning's barrier is inside
        if trainer.is_global_zero:
            self.saved.append(path)
            print(f"ddptui: checkpoint saved: {path}", flush=True)


def callback_for(package: str) -> type:
    """DdptuiCallback on `package`'s Callback (lightning.pytorch or pytorch_lightning: a
    Trainer takes only its own package's callbacks, and both may be installed)."""
    base = Callback
    if base.__module__.split(".")[0] == package.split(".")[0]:
        return DdptuiCallback
    import importlib

    base = importlib.import_module(package).Callback
    body = {k: v for k, v in vars(DdptuiCallback).items() if k not in ("__dict__", "__weakref__")}
    return type("DdptuiCallback", (base,), body)
