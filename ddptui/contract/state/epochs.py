"""The epochs table's data: finished epochs (or parts of one, cut by a change) merged across
ranks, and the epoch now running, folded from the lowest member's step events as they come."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddptui.contract.protocol.events import Epoch

KEPT = 16  # ranks' epoch events a row keeps whole (rank 0's besides)


@dataclass
class EpochRow:
    """An epoch, or the segment of one between two settings or world changes."""

    epoch: int
    start_step: int = 0
    restart: int = 0  # a script's group started again: its epochs are rows of their own
    # rank -> its epoch event: rank 0's and the first KEPT others'; past those (a job of
    # hundreds of ranks, whose rows attach keeps beside its log) the rest are summed in `folded`
    ranks: dict = field(default_factory=dict)
    said: bool = False  # its line is in the events
    folded: dict = field(default_factory=dict)  # "ranks", "measured", "rate", "wait", "bad", "seconds"

    @property
    def count(self) -> int:
        """The ranks whose event came."""
        return len(self.ranks) + len(self.folded.get("ranks", ()))

    def take(self, ev: Epoch) -> None:
        f = self.folded
        if ev.rank == 0 or ev.rank in self.ranks or len(self.ranks) < KEPT:
            self.ranks[ev.rank] = ev
        elif ev.rank not in f.setdefault("ranks", []):  # (a rank's row comes once)
            f["ranks"].append(ev.rank)
            measured = ev.source != "output"
            f["measured"] = f.get("measured", 0) + measured
            f["rate"] = f.get("rate", 0.0) + (ev.samples_per_s if measured else 0.0)
            f["wait"] = f.get("wait", 0.0) + (ev.data_wait if measured else 0.0)
            f["bad"] = f.get("bad", 0) + (ev.bad_samples or 0)
            f["seconds"] = max(f.get("seconds", 0.0), ev.seconds)

    def merged(self, cpu: bool = False) -> dict:
        """The row of every rank's event; a figure no rank knew is None (a script's rows read
        from its output have no rates, no input wait). `cpu`: the prefetcher, a CUDA side
        stream, is n/a."""
        evs: list[Epoch] = list(self.ranks.values())
        first, f, came = self.ranks.get(0, evs[0]), self.folded, self.count
        world = first.world_size or came
        measured = [e for e in evs if e.source != "output"]
        n_measured = len(measured) + f.get("measured", 0)
        rate = sum(e.samples_per_s for e in measured) + f.get("rate", 0.0) if n_measured \
            else None
        if rate is not None and came < world:  # a rank died before it could report:
            rate *= world / came  # lockstep, so scale
        settings = dict(first.settings)
        if cpu and settings:
            settings["prefetch"] = "n/a"
        return {
            "epoch": self.epoch, "start_step": self.start_step, "restart": self.restart,
            "end_step": first.end_step, "partial": bool(first.partial), "settings": settings,
            "samples_per_s": rate,
            "bad_samples": sum(e.bad_samples or 0 for e in evs) + f.get("bad", 0),
            "at_quit": bool(first.at_quit), "rolled_back": first.rolled_back,
            "data_wait": ((sum(e.data_wait for e in measured) + f.get("wait", 0.0)) / n_measured
                          if n_measured else None),
            "train_loss": first.train_loss, "val_loss": first.val_loss, "val_acc": first.val_acc,
            "seconds": max(max(e.seconds for e in evs), f.get("seconds", 0.0)),
            "world_size": world, "ranks": came,
            "source": first.source, "metrics": first.metrics or {}, "at_step": first.at_step,
            "steps_per_s": first.steps_per_s,
        }


class LiveEpoch:
    """The running epoch (or the part of it since the last change): its mean img/s and input
    wait so far, latest loss and progress; reset when a part of it ends, gone when it does."""

    def __init__(self):
        self.now: dict | None = None

    def step(self, epoch: int, step: int, loss: float | None, progress: float, data_wait: float,
             t: float, rate: float, steps_per_s: float | None = None) -> None:
        """`steps_per_s`: a script that names no epochs (its iterations a second)."""
        live = self.now
        if live is None or live["epoch"] != epoch:
            live = self.now = {"epoch": epoch, "start_step": 0, "t0": t, "n": 0,
                               "rate_sum": 0.0, "wait_sum": 0.0}
        live["n"] += 1
        live["rate_sum"] += rate
        live["wait_sum"] += data_wait
        live.update(step=step, loss=loss, progress=progress, iteration=steps_per_s is not None,
                    steps_per_s=steps_per_s or 0.0)

    def ended(self, ev: Epoch, t: float) -> None:
        """An epoch event: the whole epoch ended, or a part of it (the row goes on after it)."""
        live = self.now
        if live is None or live["epoch"] != ev.epoch:
            return
        if ev.partial:
            self.now = {**live, "start_step": ev.end_step or 0, "n": 0, "rate_sum": 0.0,
                        "wait_sum": 0.0, "t0": t}
        else:
            self.now = None

    def row(self, now: float, settings: dict, world_size: int | None) -> dict | None:
        live = self.now
        if live is None or not live["n"]:
            return None
        return {"epoch": live["epoch"], "start_step": live["start_step"], "step": live["step"],
                "progress": live["progress"], "loss": live["loss"],
                "samples_per_s": live["rate_sum"] / live["n"],
                "data_wait": live["wait_sum"] / live["n"], "seconds": now - live["t0"],
                "settings": dict(settings), "world_size": world_size,
                "iteration": live.get("iteration", False),
                "steps_per_s": live.get("steps_per_s", 0.0)}
