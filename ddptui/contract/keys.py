"""The dashboard's keys, described once: the app's BINDINGS, the help screen, `ddptui --help`
and the README's table are made from this list (a test checks the README)."""

from __future__ import annotations

from collections.abc import Callable
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
    Key("slash", "jump", "Go to rank", "/",
        "go to a rank by its number (/ 300 Enter); from 24 ranks on several nodes the table "
        "shows a row a node, the selected rank's node open, troubled ranks pinned on top",
        footer=False),
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
    Key("h", "heat", "Heat map", "h",
        "every rank's step time over the last minutes at a glance: a column a rank (or a few), "
        "a row a second, coloured against that second's median (a straggler is a stripe, a "
        "hang a dark column)", footer=False),
    Key("e", "steptime", "Step time", "e",
        "where each rank's step time goes: its phases (data-wait, copy, forward, backward, "
        "all-reduce wait, optimizer, rest) and memory, the world's over time, and who is slow "
        "in which phase and why", footer=False),
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
    Key("K", "end_job", "End job", "K",
        "end the whole job ddptui attached to (asked first): every rank gets SIGTERM through its "
        "wrapper, SIGKILL after --grace (10 s) if still there, and its launcher ends; in a run "
        "ddptui owns, q ends it"),
    Key("d", "detach", "Detach", "d",
        "leave the dashboard, the run goes on (as when its terminal closes); `ddptui attach` "
        "brings it back"),
    Key("question_mark", "help", "Help", "?", "this help"),
    Key("q", "quit", "Quit", "q, Ctrl-C",
        "end the run, asked first (y ends it, d leaves it going): ranks stop at an agreed step, "
        "checkpoint (with --checkpoint-dir), every process ends; a stalled rank is not waited "
        "for; a replay, an attach --listen or a finished run just closes"),
)
SCRIPT_KEYS = ("(your own script)",
               "s, r, k offer to restart every rank (k kills the selected one at once), but with "
               "`run.elastic()` they act on the selected rank as above; r on a failed run starts "
               "it again; space, c and a clean q need `ddptui.init()`; p, w/W, "
               "b, a need `run.loader()`")


# What s, r and k do for a script without run.elastic(): torchrun's unit is the whole group.
GROUP_DOES = {
    "s": "restart every rank (asked first): your script has no run.elastic(), so its ranks "
         "cannot leave one by one",
    "r": "restart every rank (asked first); on a failed run, start it again",
    "k": "kill the selected rank at once, then restart every rank (asked first): your script "
         "has no run.elastic()",
}


def key_rows(why_not: Callable[[str], str | None],
             group: Callable[[str], bool]) -> list[tuple[str, str]]:
    """(key, what it does in the run on screen) for the help: `why_not(action)` says why a key
    cannot act there (its row says so instead), `group(key)` whether s, r, k act on every rank."""
    rows = []
    for k in KEYS:
        if not k.shown:
            continue
        name = k.keys.split(",")[0]
        why = why_not(k.action.split("(")[0])
        if why:
            rows.append((k.shown, f"*cannot act here:* {why}"))
        elif name in GROUP_DOES and group(name):
            rows.append((k.shown, GROUP_DOES[name]))
        else:
            rows.append((k.shown, k.does))
    return rows


def keys_table(rows: list[tuple[str, str]] | None = None) -> str:
    """The Markdown table of the README (every kind of run: `rows` None) or of the help screen
    for one run."""
    lines = ["| key | what it does |", "|---|---|"]
    if rows is None:
        rows = [(k.shown, k.does) for k in KEYS if k.shown] + [SCRIPT_KEYS]
    lines += [f"| {key} | {does} |" for key, does in rows]
    return "\n".join(lines)


def keys_lines() -> list[str]:
    """For `ddptui --help`: each key and the first words of what it does."""
    return [f"  {k.shown:<10} {k.does.split(';')[0].split(':')[0].split(' (')[0]}"
            for k in KEYS if k.shown]
