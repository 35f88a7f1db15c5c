"""How the training libraries users run print their lines, in one table: which lines are a
training step's figures, which are held-out (validation, test) figures that are never charted as
steps, which are summaries (an epoch's or the run's totals) that are no step at all, and where
each says its epoch and step. A line no shape knows is read generically (metrics.py).

Each shape has a test built from the library's own output (tests/data/output/).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
TRAIN, HELD_OUT, SUMMARY = "train", "held-out", "summary"


def _epoch_done(value: float) -> float:
    """Hugging Face logs the epochs done so far (0.25, 1.0 at the end of epoch 0): the epoch
    a line belongs to."""
    return max(math.ceil(value) - 1, 0)


@dataclass(frozen=True)
class Shape:
    """One kind of line of one library."""

    library: str
    kind: str  # TRAIN, HELD_OUT or SUMMARY
    line: re.Pattern  # the line is of this shape
    epoch: re.Pattern | None = None  # group 1: the epoch it names
    step: re.Pattern | None = None  # group 1: its step (an iteration, an update)
    figures: dict[str, re.Pattern] = field(default_factory=dict)  # name -> group 1: its value
    epoch_of: Callable[[float], float] = float  # the epoch the printed number means

    def read(self, line: str) -> dict[str, float]:
        """Its epoch, step and own figures (the generic reading adds the rest)."""
        values: dict[str, float] = {}
        for name, pattern in (("epoch", self.epoch), ("step", self.step), *self.figures.items()):
            m = pattern.search(line) if pattern is not None else None
            if m:
                try:
                    values[name] = float(m.group(1))
                except ValueError:
                    continue
        if "epoch" in values:
            values["epoch"] = self.epoch_of(values["epoch"])
        return values


def _c(pattern: str) -> re.Pattern:
    return re.compile(pattern)


_AVERAGE = r"\S+\s+\(\s*(" + NUMBER + r")\s*\)"  # timm's `Loss: 0.651 ( 0.694)`: the average
_DICT_EPOCH = _c(r"['\"]epoch['\"]:\s*['\"]?(" + NUMBER + ")")

SHAPES: tuple[Shape, ...] = (
    # timm's train.py: `Train: 0 [   3/4 (100%)]  Loss: 0.738 (0.716) ...`, `Test: [   1/1] ...
    # Loss:   0.651 ( 0.694)  Acc@1: 100.000 ( 50.000)`, and its --result summary, pretty JSON.
    Shape("timm", TRAIN, _c(r"^Train: \d+ \[\s*\d+/"), epoch=_c(r"^Train: (\d+)"),
          step=_c(r"^Train: \d+ \[\s*(\d+)/")),
    Shape("timm", HELD_OUT, _c(r"^Test(?: \(EMA\))?: \[\s*\d+/"),
          figures={"val_loss": _c(r"Loss:\s*" + _AVERAGE), "val_acc": _c(r"Acc@1:\s*" + _AVERAGE)}),
    Shape("json", SUMMARY, _c(r"^\s*\"[\w.]+\":\s*(?:" + NUMBER + r"),?\s*$")),
    # mmengine (mmdet, mmpretrain...): `Epoch(train) [1][10/20]  lr: ...  loss: 5.0815`,
    # `Epoch(val) [1][5/5]    accuracy: 9.6875`; an iteration-based runner's `Iter(train) [...]`.
    Shape("mmengine", TRAIN, _c(r"\b(?:Epoch|Iter)\(train\)\s*\["),
          epoch=_c(r"\bEpoch\(train\)\s*\[(\d+)\]"),
          step=_c(r"\((?:train)\)\s*(?:\[\d+\])?\[\s*(\d+)/")),
    Shape("mmengine", HELD_OUT, _c(r"\b(?:Epoch|Iter)\((?:val|test)\)\s*\["),
          epoch=_c(r"\bEpoch\((?:val|test)\)\s*\[(\d+)\]")),
    # Hugging Face's Trainer: `{'loss': '1.393', ..., 'epoch': '0.25'}`, `{'eval_loss': ...}`,
    # and the run's totals `{'train_runtime': ..., 'train_loss': ...}`.
    Shape("transformers", SUMMARY, _c(r"^\{['\"]train_runtime['\"]")),
    Shape("transformers", HELD_OUT, _c(r"^\{['\"]eval_"), epoch=_DICT_EPOCH,
          epoch_of=_epoch_done),
    Shape("transformers", TRAIN, _c(r"^\{['\"]loss['\"]:.*['\"]epoch['\"]"), epoch=_DICT_EPOCH,
          epoch_of=_epoch_done),
    # accelerate's examples: `epoch 0: {'accuracy': 0.52, 'f1': 0.6}`, the evaluation's metrics.
    Shape("accelerate", HELD_OUT, _c(r"^epoch (\d+): \{"), epoch=_c(r"^epoch (\d+):")),
    # fairseq, simple and JSON formats, 0.9 and 0.12: `epoch 001:  10 / 30 loss=6.871, ...,
    # num_updates=10`, `valid on 'valid' subset | loss 6.864`, and each epoch's averages
    # (`train | epoch 001 | loss 6.867`, `| epoch 001 | loss 6.862` in 0.9).
    Shape("fairseq", HELD_OUT, _c(r"valid on '[^']*' subset|\| valid \| \{|^\{\"epoch\": \d+, "
                                  r"\"valid_"), epoch=_c(r"\bepoch\"?:? (\d+)")),
    Shape("fairseq", SUMMARY, _c(r"\| train \| |^\| epoch \d+ \| loss |^\{\"epoch\": \d+, "
                                 r"\"train_")),
    Shape("fairseq", TRAIN, _c(r"\bepoch \d+:\s+\d+ / \d+ |\| train_inner \| \{|^\{\"epoch\": "
                               r"\d+, \"update\""), epoch=_c(r"\bepoch\"?:? 0*(\d+)"),
          step=_c(r"\bnum_updates\"?[=:] ?\"?(\d+)")),
    # detectron2's events writer: `[.. d2.utils.events]:  eta: ..  iter: 19  total_loss: 2.082
    # loss_cls: 0.7395 ...`: iterations, the total loss; its evaluation as `copypaste:` rows.
    Shape("detectron2", TRAIN, _c(r"\biter: \d+\s+total_loss: "), step=_c(r"\biter: (\d+)"),
          figures={"loss": _c(r"\btotal_loss: (" + NUMBER + ")")}),
    Shape("detectron2", SUMMARY, _c(r"\bcopypaste: ")),
)


def shape_of(line: str) -> Shape | None:
    """The first shape the line is of, or None (a line read generically)."""
    for shape in SHAPES:
        if shape.line.search(line):
            return shape
    return None
