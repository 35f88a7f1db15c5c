"""Loss and other figures read from what a script already prints (`loss: 0.123`, `loss=0.123`,
`'loss': 0.123`, and the lines of the libraries in shapes.py: timm, mmengine, Lightning,
Hugging Face, accelerate, fairseq, detectron2), turned into the same step and epoch events as
the built-in trainer sends, so the charts and the epochs table need no code. Held-out figures
(validation, test) go to the epochs table, never to the loss chart.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable

from ddptui.contract.observe.shapes import HELD_OUT, NUMBER, SUMMARY, shape_of
from ddptui.contract.protocol.events import Epoch, Step

# A name as a word of its own (not the tail of val_loss), quoted or not, then : or =, then the
# number, quoted or not (transformers 5 logs '0.2272'), or as torch prints it:
# tensor(0.123, device='cuda:0').
_VALUE = r"['\"]?(?:\s*[:=]\s*['\"]?|\s+)(?:tensor\()?\s*(" + NUMBER + r")"
_HELD_OUT = r"(?:val|valid|validation|eval|test)[_ ]"  # nanoGPT writes 'val loss 2.1'
BUILT_IN = {
    "loss": r"(?<!val )(?<!valid )(?<!validation )(?<!eval )(?<!test )"
            r"(?:train_|training_)?loss(?:_step)?",
    "val_loss": _HELD_OUT + "loss",
    "val_acc": _HELD_OUT + r"acc(?:uracy)?",
    "lr": r"lr|learning_rate",
}
_EPOCH = re.compile(r"(?<![\w.])['\"]?epoch['\"]?\s*[:=]?\s*['\"]?\[?\s*(\d+(?:\.\d+)?)", re.I)
_STEP = re.compile(r"(?<![\w.])['\"]?(?:step|iter|iteration|batch)['\"]?\s*[:=]?\s*\[?\s*(\d+)",
                   re.I)
# At most this often a step event (as the built-in loop sends): the losses read in between are
# summed into it, so a script printing a loss line per step cannot flood the log.
STEP_EVERY_S = 0.05


def compile_metrics(extra: tuple[tuple[str, str | None], ...] = ()) -> dict[str, re.Pattern]:
    """name -> a pattern whose first group is the value."""
    found = {name: re.compile(rf"(?<![\w.])['\"]?(?:{names}){_VALUE}", re.I)
             for name, names in BUILT_IN.items()}
    for name, regex in extra:
        found[name] = re.compile(regex) if regex else \
            re.compile(rf"(?<![\w.])['\"]?{re.escape(name)}{_VALUE}", re.I)
    return found


def read_line(line: str, patterns: dict[str, re.Pattern]) -> dict[str, float]:
    """The figures one line carries, by name (epoch and step included, when it says them)."""
    values = {}
    for name, pattern in patterns.items():
        m = pattern.search(line)
        if m:
            value = _float(m.group(1))
            if value is not None:
                values[name] = value
    if values:  # an epoch or step on a line of figures only: 'Epoch 3' in prose is no mark
        for name, pattern in (("epoch", _EPOCH), ("step", _STEP)):
            m = pattern.search(line)
            if m:
                values[name] = float(m.group(1))
    return values


# A held-out line's accuracy, whatever the library calls it (mmengine's accuracy, timm's Acc@1).
_ACCURACY = re.compile(r"(?<![\w.])['\"]?(?:acc(?:uracy)?|top-?1|acc@?1)['\"]?\s*[:=]\s*['\"]?("
                       + NUMBER + ")", re.I)


def read_shaped(line: str, patterns: dict[str, re.Pattern]) -> tuple[dict[str, float], str | None]:
    """The figures one line carries and its kind: a library's shape (shapes.py) where one knows
    the line (a summary carries none; a held-out line's loss and accuracy are val_loss and
    val_acc), else read generically (kind None)."""
    shape = shape_of(line)
    if shape is None:
        return read_line(line, patterns), None
    if shape.kind == SUMMARY:
        return {}, SUMMARY
    values = {**read_line(line, patterns), **shape.read(line)}
    if shape.kind == HELD_OUT:
        loss = values.pop("loss", None)
        if loss is not None:
            values.setdefault("val_loss", loss)
        m = _ACCURACY.search(line)
        if m and "val_acc" not in values and _float(m.group(1)) is not None:
            values["val_acc"] = float(m.group(1))
    return values, shape.kind


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class MetricReader:
    """One rank's figures from its output: step events with the mean loss of the lines read
    since the last (at most every STEP_EVERY_S; flush() sends what waits), and an epoch event
    each time the epoch it prints moves on."""

    def __init__(self, rank: int, patterns: dict[str, re.Pattern],
                 emit: Callable[[Step | Epoch], None], clock: Callable[[], float] = time.time):
        self.rank, self.patterns, self.emit, self.clock = rank, patterns, emit, clock
        self.epoch: int | None = None
        self.points = 0  # loss readings so far: the step count when the script prints none
        self._sent_t = 0.0
        self._unsent: list[float] = []  # losses read since the last step event
        self._latest: dict[str, float] = {}
        self._epoch_start = clock()
        self._epoch_losses: list[float] = []
        self._epoch_figures: dict[str, float] = {}
        self._rate_from: tuple[float, int] | None = None  # (when, step) of the last step event
        self._row_from = 0  # an epoch-less script: the iteration its current eval row began at

    def line(self, text: str, final: bool) -> None:
        values, kind = read_shaped(text, self.patterns)
        if not values:
            return
        # A line read generically that moves the epoch on still speaks of the one that ended
        # (Lightning's bar keeps the last validation's figures); a library's shape names the
        # epoch its figures belong to.
        carried = kind is None
        moved = "epoch" in values and self._epoch_moves(int(values["epoch"]),
                                                        values if carried else {})
        if "loss" in values and math.isfinite(values["loss"]):
            self.points += 1
            self._epoch_losses.append(values["loss"])
            self._unsent.append(values["loss"])
        if not (moved and carried):
            self._epoch_figures.update({k: v for k, v in values.items()
                                        if k not in ("loss", "epoch", "step")})
        self._latest.update(values)
        if "val_loss" in values and self.epoch is None and "step" in values:
            self._eval_row(int(values["step"]))  # an iteration-based script's evaluation
        elif "loss" in values:
            self.flush()

    def flush(self, force: bool = False) -> None:
        """A step event for the losses read since the last one, if it is time (`force`: now)."""
        now = self.clock()
        if not self._unsent or not force and now - self._sent_t < STEP_EVERY_S:
            return
        self._sent_t = now
        v, losses, self._unsent = self._latest, self._unsent, []
        step = int(v.get("step", self.points))
        extra = {k: x for k, x in v.items() if k not in ("loss", "epoch", "step")}
        rate = self._steps_per_s(now, step) if "step" in v else None
        self.emit(Step(rank=self.rank, epoch=self.epoch or 0, step=step, global_step=step,
                       loss=sum(losses) / len(losses), steps=len(losses), source="output",
                       metrics=extra or None,
                       iteration=True if self.epoch is None and "step" in v else None,
                       steps_per_s=rate or None))

    def _steps_per_s(self, now: float, step: int) -> float | None:
        """Steps a second since the last step event, from the step numbers printed."""
        last, self._rate_from = self._rate_from, (now, step)
        if last is None or step <= last[1] or now <= last[0]:
            return None
        return round((step - last[1]) / (now - last[0]), 3)

    def _eval_row(self, step: int) -> None:
        """A script that names no epochs printed an evaluation: the iterations since the last
        one become a row (nanoGPT's 'step 250: train loss 2.08, val loss 2.11')."""
        self.flush(force=True)
        now, figures = self.clock(), self._latest
        seconds = now - self._epoch_start
        losses = self._epoch_losses
        extra = {k: x for k, x in figures.items()
                 if k not in ("loss", "epoch", "step", "val_loss", "val_acc")}
        self.emit(Epoch(rank=self.rank, epoch=0, seconds=round(seconds, 3), samples=0,
                        samples_per_s=0.0, data_wait=0.0, settings={}, source="output",
                        partial=True, start_step=step, end_step=step, at_step=step,
                        steps_per_s=round((step - self._row_from) / seconds, 3) if seconds > 0
                        else 0.0,
                        train_loss=figures.get("loss") if "loss" in figures else
                        sum(losses) / len(losses) if losses else None,
                        val_loss=figures.get("val_loss"),
                        val_acc=_fraction(figures.get("val_acc")), metrics=extra))
        self._epoch_start, self._epoch_losses, self._row_from = now, [], step
        self._latest, self._epoch_figures = {}, {}

    def _epoch_moves(self, epoch: int, values: dict[str, float]) -> bool:
        """True when this line moved the epoch on (and ended the last one's row)."""
        if self.epoch is None:
            self.epoch, self._epoch_start = epoch, self.clock()
            return False
        if epoch <= self.epoch:
            return False
        # What the line says of the epoch that ended (`values`: a line read generically).
        self._epoch_figures.update({k: x for k, x in values.items()
                                    if k not in ("loss", "epoch", "step")})
        self.finish_epoch()
        self.epoch = epoch
        return True

    def finish_epoch(self, partial: bool = False) -> None:
        """An epoch event for the epoch read so far (at the next epoch, or at the rank's end)."""
        self.flush(force=True)  # the epoch's last losses belong to its chart, before its row
        if self.epoch is None or not self._epoch_losses and not self._epoch_figures:
            return
        now = self.clock()
        figures = dict(self._epoch_figures)
        losses = self._epoch_losses
        self.emit(Epoch(rank=self.rank, epoch=self.epoch,
                        seconds=round(now - self._epoch_start, 3), samples=0, samples_per_s=0.0,
                        data_wait=0.0, settings={},
                        train_loss=sum(losses) / len(losses) if losses else None,
                        val_loss=figures.pop("val_loss", None),
                        val_acc=_fraction(figures.pop("val_acc", None)), metrics=figures,
                        source="output", partial=True if partial else None,
                        end_step=self.points if partial else None))
        self._epoch_start, self._epoch_losses, self._epoch_figures = now, [], {}


def _fraction(acc: float | None) -> float | None:
    """Accuracy as a fraction, as the epochs table shows it (a script may print 93.1 or 0.931)."""
    return None if acc is None else acc / 100 if acc > 1 else acc
