"""The framework callbacks, added where a script has none: under `ddptui run`, a Lightning, Hugging
Face Trainer or Keras script gets what its callback gives with no line changed. And Lightning's
progress bar is its plain one: rich's (chosen because rich is installed, as Textual brings it)
draws into a pipe only its last frame, so a rank's output said nothing of its steps.

Installed by the injected start-up in a rank of a script's run; each patch waits for its
framework's module to be imported, and imports nothing itself before that.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys

from ddptui.rank.patching import after_import

LIGHTNING = ("lightning.pytorch", "pytorch_lightning")


def install() -> None:
    patches = {f"{package}.trainer.connectors.callback_connector":
               functools.partial(_lightning, package) for package in LIGHTNING}
    patches["transformers.trainer"] = _transformers
    patches["keras.src.backend.torch.trainer"] = _keras
    after_import(patches)


def _say(text: str) -> None:
    """Once a run: by its first rank, or its launcher (which has no RANK), not by a process
    that one starts."""
    if os.environ.get("RANK", "0") == "0" and \
            os.environ.get("DDPTUI_PARENT") in (str(os.getppid()), str(os.getpid())):
        print(f"ddptui: {text}", file=sys.stderr, flush=True)


def _ours(callbacks) -> bool:
    return any(type(c).__name__ == "DdptuiCallback" and
               type(c).__module__.startswith("ddptui.") for c in callbacks)


def _lightning(package: str, module) -> None:
    """The Trainer's callbacks get ddptui's; its progress bar, when the script chose none, is
    TQDM's (its model summary the plain one, as without rich)."""
    if module._RICH_AVAILABLE:
        module._RICH_AVAILABLE = False
        _say("Lightning's progress bar is its TQDM one: rich's draws only its last frame into "
             "the pipe ddptui reads (a bar of your own in callbacks is kept)")
    connector = module._CallbackConnector
    original = connector.on_trainer_init

    @functools.wraps(original)
    def on_trainer_init(self, callbacks, *args, **kwargs):
        given = [] if callbacks is None else \
            list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        if not _ours(given):
            from ddptui.rank.integrations.lightning import callback_for

            given.append(callback_for(package)())
            _say("added ddptui's Lightning callback: each rank's loss and samples, epoch rows "
                 "with validation, c, q and space (yours in callbacks instead sets its options)")
        return original(self, given, *args, **kwargs)

    connector.on_trainer_init = on_trainer_init


def _transformers(module) -> None:
    trainer = module.Trainer
    original = trainer.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not _ours(self.callback_handler.callbacks):
            from ddptui.rank.integrations.transformers import DdptuiCallback

            self.add_callback(DdptuiCallback())
            _say("added ddptui's Hugging Face Trainer callback: each rank's loss and samples, "
                 "epoch rows with evaluation, c, q and space")

    trainer.__init__ = __init__


def _keras(module) -> None:
    """fit() gets ddptui's callback, leaving each process's training its own, as the script
    wrote it (DdptuiCallback() of your own makes fit() data-parallel)."""
    trainer = module.TorchTrainer
    original = trainer.fit
    signature = inspect.signature(original)

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        callbacks = list(bound.arguments.get("callbacks") or [])
        if not _ours(callbacks):
            from ddptui.rank.integrations.keras import DdptuiCallback

            bound.arguments["callbacks"] = [*callbacks, DdptuiCallback(data_parallel=False)]
            _say("added ddptui's Keras callback: each rank's loss and samples, epoch rows with "
                 "validation, c, q and space; each process trains on its own, as written")
        return original(*bound.args, **bound.kwargs)

    trainer.fit = fit
