"""DdptuiCallback for Keras 3 on the torch backend: `model.fit(..., callbacks=[DdptuiCallback()])`
in a script that `ddptui run train.py --gpus ...` starts once per GPU (or torchrun, with
DDPTUI_REPORT for `ddptui attach`).

Keras's fit() trains each process on its own. With a process group of more than one rank, the
callback makes it data-parallel as DDP would: every rank starts from rank 0's weights, each
gradient is averaged across the ranks as backward produces it (a hook per weight, called in
the same order on every rank), and the layers' statistics (BatchNorm's moving mean...) are rank
0's before each validation. Shard the data yourself (a DataLoader with a DistributedSampler).
Every rank reports its own loss per batch (the loss tensor of its step, never synced) and its
samples; each epoch's row carries fit()'s metrics (val_loss, val_accuracy...). The dashboard's c
saves the model (model.save on rank 0: the weights are the same on every rank) at the same step
on every rank, q sets model.stop_training on every rank, space pauses every rank.
"""

from __future__ import annotations

import os

import keras
import torch
import torch.distributed as dist

import ddptui
from ddptui.rank.prefetch import tensors_of


class DdptuiCallback(keras.callbacks.Callback):
    """Add it to fit()'s callbacks; without ddptui around it only averages the gradients."""

    def __init__(self, checkpoint_dir: str = "checkpoints", data_parallel: bool = True):
        """`checkpoint_dir`: where c saves (`ddptui-epoch=E-step=S.keras`); `data_parallel`:
        False to leave each process's fit() on its own."""
        super().__init__()
        self.checkpoint_dir, self.data_parallel = checkpoint_dir, data_parallel
        self.run = None
        self.saved: list[str] = []  # the models c saved, on rank 0
        self._loss = None  # the last training step's loss tensor
        self._samples = 0
        self._epoch = 0
        self._undo: list = []  # hooks and the wrapped compute_loss, removed at the end

    def on_train_begin(self, logs=None) -> None:
        if keras.backend.backend() != "torch":
            raise RuntimeError("ddptui's Keras callback needs the torch backend "
                               "(KERAS_BACKEND=torch)")
        self.run = self.run or ddptui.init()
        self._watch_steps()
        if self._parallel:
            self._average_gradients()

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epoch = epoch
        self.run.epoch(epoch)

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        self.run.step(self._loss, samples=self._samples)
        if self.run.should_checkpoint:
            self._save()
        if self.run.should_stop:
            self.model.stop_training = True

    def on_test_begin(self, logs=None) -> None:
        if self._parallel:
            for v in self.model.non_trainable_variables:
                dist.broadcast(v.value.data, src=0)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        self.run.log(**{k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))})

    def on_train_end(self, logs=None) -> None:
        for undo in self._undo:
            undo()
        self._undo.clear()
        self.run.done()

    @property
    def _parallel(self) -> bool:
        """fit() is made data-parallel: asked for, and a process group of more than one rank."""
        return self.data_parallel and dist.is_initialized() and dist.get_world_size() > 1

    def _watch_steps(self) -> None:
        """The loss fit() computes, kept as the tensor it is; the samples from the model's
        input (a forward hook: fit() hands callbacks no batch)."""
        model, compute_loss = self.model, self.model.compute_loss

        def keep_loss(*args, **kwargs):
            loss = compute_loss(*args, **kwargs)
            if model.training:
                self._loss = loss.detach()
            return loss

        def count(module, inputs, output) -> None:
            if module.training:
                found = tensors_of(list(inputs))
                self._samples = len(found[0]) if found and found[0].dim() else 0

        model.compute_loss = keep_loss
        hook = model.register_forward_hook(count)
        self._undo += [hook.remove, lambda: delattr(model, "compute_loss")]

    def _average_gradients(self) -> None:
        world = dist.get_world_size()
        for v in self.model.variables:  # weights, statistics and all: rank 0's
            dist.broadcast(v.value.data, src=0)

        def average(param: torch.Tensor) -> None:
            dist.all_reduce(param.grad)  # SUM: gloo has no AVG
            param.grad.div_(world)

        for v in self.model.trainable_variables:
            self._undo.append(v.value.register_post_accumulate_grad_hook(average).remove)

    def _save(self) -> None:
        if self.run.rank != 0:
            return
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        path = os.path.join(self.checkpoint_dir, f"ddptui-epoch={self._epoch}-"
                                                 f"step={self.run.global_step}.keras")
        self.model.save(path)
        self.saved.append(path)
        print(f"ddptui: checkpoint saved: {path}", flush=True)
