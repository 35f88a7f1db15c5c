"""DdptuiCallback for the Hugging Face Trainer (and so Accelerate-launched scripts):
`Trainer(..., callbacks=[DdptuiCallback()])` under `ddptui run train.py`, or under torchrun or
accelerate launch with DDPTUI_REPORT for `ddptui attach`.

The Trainer gathers the loss before any callback sees it; this one reads each rank's own loss
from its model's forward (a hook: the loss tensor, summed on the device, never synced), and the
samples from its inputs. Epoch rows carry the evaluation's metrics (eval_loss, eval_accuracy...).
The dashboard's c sets control.should_save and q control.should_training_stop on every rank at
the same step; space pauses every rank.
"""

from __future__ import annotations

from transformers import TrainerCallback

import ddptui
from ddptui.rank.prefetch import tensors_of


class DdptuiCallback(TrainerCallback):
    """Add it to the Trainer's callbacks; it does nothing where ddptui is not around."""

    def __init__(self):
        self.run = None
        self._losses: list = []  # this optimizer step's micro-batch losses (on the device)
        self._samples = 0
        self._hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.run = ddptui.init()
        if model is not None and self._hook is None and self.run.active:
            self._hook = model.register_forward_hook(self._grab, with_kwargs=True)

    def _grab(self, module, inputs, kwargs, output) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if module.training and loss is not None:
            self._losses.append(loss.detach())
            found = tensors_of(list(inputs) + list(kwargs.values()))
            self._samples += len(found[0]) if found and found[0].dim() else 0

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.run.epoch(int(state.epoch or 0))

    def on_step_end(self, args, state, control, **kwargs):
        losses, self._losses = self._losses, []
        # The micro-batches' mean, on the device (no sync); one micro-batch needs no kernel.
        loss = losses[0] if len(losses) == 1 else sum(losses) / len(losses) if losses else None
        self.run.step(loss, samples=self._samples)
        self._samples = 0
        if self.run.should_checkpoint:
            control.should_save = True
        if self.run.should_stop:
            control.should_training_stop = True

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.run.log(**{k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float))})

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.run.done()
