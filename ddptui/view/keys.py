"""The dashboard's keys, described once: the app's BINDINGS, the help screen, `ddptui --help`
and the README's table are made from this list (a test checks the README)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Key:
    keys: str  # Textual key names, comma-separated
    action: str
    label: str  # the footer's word for it
    shown: str  # how the help and the README write the key
    does: str  # what it does, in a table cell
    footer: bool = True


KEYS = (
    Key("up", "select(-1)", "Prev rank", "up / down", "select a rank", footer=False),
    Key("down", "select(1)", "Next rank", "", "", footer=False),
    Key("s", "stop_rank", "Stop rank", "s",
        "stop the selected rank at the next agreed step; the others go on re-sharded, every "
        "sample still once (the last rank cannot be stopped)"),
    Key("r", "restart_rank", "Restart rank", "r",
        "restart the selected rank: a stopped or crashed rank joins again from its warm "
        "standby (queued while it warms); a running one leaves and joins again"),
    Key("k", "kill_rank", "Kill rank", "k",
        "kill the selected rank (a stalled one above all): the others go on through crash recovery"),
    Key("t", "stacks", "Stacks", "t",
        "the selected rank's Python stacks, every thread (a stalled rank's are taken when it is "
        "flagged); a script's GPU rank also says which NCCL collective it is in"),
    Key("g", "gpus", "GPU detail", "g",
        "the GPU screen: each GPU's load, memory and power over five minutes, clocks and why "
        "they are held down, PCIe and NVLink traffic, other processes"),
    Key("space", "pause", "Pause", "space",
        "pause / resume every rank at the same step (PAUSING until they all wait)"),
    Key("p", "toggle('prefetch')", "Prefetch", "p", "prefetcher on/off, from the next epoch"),
    Key("w", "workers(-1)", "Workers-", "w / W", "DataLoader workers -1 / +1, from the next epoch"),
    Key("W", "workers(1)", "Workers+", "", ""),
    Key("b", "toggle('cudnn_benchmark')", "Benchmark", "b",
        "cudnn.benchmark on/off, from the next epoch"),
    Key("a", "apply", "Apply now", "a",
        "apply pending settings now, at the next agreed step (no sample skipped or seen twice)"),
    Key("c", "checkpoint", "Checkpoint", "c", "checkpoint now (needs --checkpoint-dir)"),
    Key("question_mark", "help", "Help", "?", "this help"),
    Key("q", "quit", "Quit", "q, Ctrl-C",
        "quit: ranks stop at an agreed step, checkpoint (with --checkpoint-dir), every process "
        "ends; a stalled rank is not waited for"),
)
SCRIPT_KEYS = ("(your own script)",
               "s, r, k offer to restart every rank (k kills the selected one at once), but with "
               "`run.elastic()` they act on the selected rank as above; r on a failed run starts "
               "it again; space, c and a clean q need `ddptui.init()`; p, w/W, "
               "b, a need `run.loader()`")


def keys_table() -> str:
    """The Markdown table of the help screen and the README."""
    rows = ["| key | what it does |", "|---|---|"]
    rows += [f"| {k.shown} | {k.does} |" for k in KEYS if k.shown]
    rows.append(f"| {SCRIPT_KEYS[0]} | {SCRIPT_KEYS[1]} |")
    return "\n".join(rows)


def keys_lines() -> list[str]:
    """For `ddptui --help`: each key and the first words of what it does."""
    return [f"  {k.shown:<10} {k.does.split(';')[0].split(':')[0].split(' (')[0]}"
            for k in KEYS if k.shown]
