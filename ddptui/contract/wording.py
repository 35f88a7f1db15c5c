"""Events in words: the lines a log pane, a headless console and a rank's own log print, and the
way every message counts and writes a setting."""

from __future__ import annotations

from ddptui.contract.protocol.events import (
    PARENT,
    Checkpoint,
    Error,
    Event,
    Notice,
    Rank,
    Run,
    Settings,
)


def describe(ev: Event) -> str | None:
    """A human line for the events a log pane or a headless console shows; None for the rest."""
    who = "" if ev.rank == PARENT else f"rank {ev.rank}: "
    match ev:
        case Notice(level=level, text=text):
            return f"{who}{'' if level == 'info' else level + ': '}{text}"
        case Settings():
            body = ", ".join(f"{k} {onoff(v)}" for k, v in ev.settings.items())
            if ev.status == "requested":
                return (f"settings requested: {body} (every rank applies them at the next "
                        "epoch; a: now)")
            step = f" step {ev.step}" if ev.step else ""
            return f"settings {ev.status or 'applied'} from epoch {ev.epoch}{step}: {body}"
        case Checkpoint():
            return f"checkpoint written: {ev.path}"
        case Rank():
            reason = f" ({ev.reason})" if ev.reason else ""
            standby = f", standby {ev.standby}" if isinstance(ev.standby, str) else ""
            return f"rank {ev.rank} {ev.state}{reason}{standby}"
        case Error():
            return f"rank {ev.rank} failed (exit code {ev.exit_code}): {ev.text}"
        case Run(status="paused" | "resumed"):
            return f"run {ev.status} at step {ev.global_step}"
    return None


def epoch_line(ev: dict) -> str:
    """An epoch's row (contract/state/epochs.py: merged across its ranks) in one line."""
    s = ev.get("settings") or {}
    # Either may come alone (mmengine and accelerate print an accuracy, fairseq a loss).
    val = (f"  val_loss {ev['val_loss']:.4f}" if ev.get("val_loss") is not None else "") + \
        (f"  val_acc {100 * ev['val_acc']:.1f}%" if ev.get("val_acc") is not None else "")
    # A rank's own event is per rank; the run state's merged row sums its `ranks`.
    n = ev.get("ranks")
    if ev.get("source") == "output":  # read from a script's output: no rates, no settings
        return f"{epoch_label(ev)}: loss {_num(ev.get('train_loss'))}{val}{figures(ev)}"
    rate = f"img/s ({count(n, 'rank')})" if n else "img/s/rank"
    samples, wait = ev.get("samples_per_s"), ev.get("data_wait")
    # Settings only where the rank has ours (a script without run.loader() has none).
    named = (f"  [prefetch {onoff(s.get('prefetch'))}, workers {onoff(s.get('workers'))}, "
             f"cudnn.benchmark {onoff(s.get('cudnn_benchmark'))}]" if s else "")
    return (f"{epoch_label(ev)}: loss {_num(ev.get('train_loss'))}{val}{figures(ev)}  "
            f"{'-' if samples is None else f'{samples:,.0f}'} {rate}  "
            f"data-wait {'-' if wait is None else f'{100 * wait:.0f}%'}{named}")


def count(n: int, noun: str) -> str:
    """'1 rank', '2 ranks': every message that counts something says it this way."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def epoch_label(ev: dict) -> str:
    """'epoch 3', 'epoch 3 steps 40-90' for the part of an epoch between two changes, or
    'step 250' for the evaluation of a script that names no epochs."""
    if ev.get("at_step") is not None:
        return f"step {ev['at_step']}"
    start, end = ev.get("start_step") or 0, ev.get("end_step")
    if start or ev.get("partial"):
        return f"epoch {ev['epoch']} steps {start}-{end}"
    return f"epoch {ev['epoch']}"


def figures(ev: dict) -> str:
    """A script's other figures of the epoch (--metric, run.log): '  acc 93.1  lr 0.01'."""
    return "".join(f"  {k} {v:.4g}" if isinstance(v, (int, float)) else f"  {k} {v}"
                   for k, v in (ev.get("metrics") or {}).items())


def _num(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def onoff(v) -> str:
    """A setting as the screens write it: on/off for a switch, '-' for none, else the value."""
    if v is None:
        return "-"
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


def ranks_named(ranks: list[int]) -> str:
    """'rank 3', 'ranks 0-2', 'ranks 0, 2 and 5'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"
