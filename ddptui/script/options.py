"""The script form of `ddptui run`: `ddptui run train.py [options] -- [script args]` and
`ddptui run -m pkg.module ...`, told apart from the built-in trainer's `ddptui run MODEL`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import sys
from dataclasses import dataclass

from trainer.argtypes import non_negative_int, positive_float, positive_int
from trainer.errors import UsageError
from trainer.options import Parser, add_sections, flags, from_args, option

GRACE_S = 30.0  # torchrun's: SIGINT or SIGTERM to the ranks, then SIGKILL after this long
STALL_S = 60.0  # a script says nothing of its steps: silence this long before a verdict

FORMS = """your own script (torchrun's contract, no code change):
  ddptui run train.py --gpus 0,1 -- --lr 0.1 --epochs 3
  ddptui run -m mypkg.train --cpus 2 -- --config small.yaml
  ddptui run train.py --gpus all --metric acc --metric top5=top-5:\\s*([\\d.]+)
  three lines in the script add per-rank loss and samples: see README, "Your own script"
"""


@dataclass(frozen=True)
class ScriptConfig:
    """What the script form asks for; the launch and the watch, never the training. Each option
    field declares its flag and help (trainer/options.py)."""

    GROUP = "launch"
    target: str = option("", flag="target", metavar="SCRIPT.py | -m MODULE")  # or the module
    module: bool = False  # target is a module (-m)
    args: tuple[str, ...] = ()  # after --
    gpus: tuple[int, ...] | None = option(
        None, "GPU indices in nvidia-smi order (0,1) or 'all': LOCAL_RANK k is the k-th named "
        "(default: all GPUs)", metavar="LIST")
    cpus: int | None = option(None, "N ranks with no GPU visible (default 2 where there is no "
                              "GPU)", type=positive_int, metavar="N")
    headless: bool = option(False, "no dashboard: the ranks' output as torchrun shows it "
                            "(automatic when not a terminal)", action="store_true")
    log: str | None = option(None, "telemetry log (default runs/<time>.jsonl; each rank's output "
                             "beside it as .rankN.out)", metavar="FILE.jsonl")
    grace: float = option(
        GRACE_S, f"after Ctrl-C, q or SIGTERM (forwarded to every rank), SIGKILL what is left "
        f"after S seconds (default {GRACE_S:.0f}, as torchrun)", type=positive_float, metavar="S")
    max_restarts: int = option(
        0, "after a rank fails, restart every rank, K times in all (the script's own checkpoint "
        "resumes it; TORCHELASTIC_RESTART_COUNT counts them)", type=non_negative_int,
        metavar="K")
    stall_after: float = option(
        STALL_S, f"flag a rank stalled after S seconds stopped, idle (no CPU, GPU idle) or "
        f"silent (no output for max(S, 3 x its longest gap)) (default {STALL_S:.0f})",
        group="watch", type=positive_float, metavar="S")
    # (name, regex with one group, or None)
    metrics: tuple[tuple[str, str | None], ...] = option(
        (), "besides loss, read NAME from the ranks' output ('NAME: 1.0', 'NAME=1.0'), or the "
        "first group of REGEX; repeatable", flag="--metric", group="watch", action="append",
        metavar="NAME[=REGEX]")
    stacks_signal: int = option(
        int(signal.SIGUSR1), "the signal that makes a rank write its Python stacks (t) (default "
        "SIGUSR1; pick another if your script handles that one)", group="watch", metavar="SIG",
        default="SIGUSR1")

    @property
    def world_size(self) -> int:
        return len(self.gpus) if self.gpus else (self.cpus or 1)

    @property
    def device_kind(self) -> str:
        return "cuda" if self.gpus else "cpu"

    @property
    def label(self) -> str:
        """How the header names the job: what the user typed, shortened."""
        return ("-m " if self.module else "") + (self.target if self.module
                                                 else os.path.basename(self.target))


def is_script_form(argv: list[str]) -> bool:
    """`run` followed by -m, a .py path, or an existing file (a model name is none of these)."""
    if len(argv) < 2 or argv[0] != "run":
        return False
    first = argv[1]
    return first in ("-m", "--module") or first.endswith(".py") or os.path.isfile(first)


def build_script_parser() -> Parser:
    p = Parser(prog="ddptui run SCRIPT", formatter_class=argparse.RawDescriptionHelpFormatter,
               description="Run your own torchrun script, one process per GPU (or CPU rank), "
               "with the environment torchrun --standalone gives it, and watch every rank. "
               "Options go before --, the script's own arguments after it.", epilog=FORMS)
    add_sections(p, ScriptConfig)
    return p


def parse_script_args(argv: list[str], resolve_devices) -> ScriptConfig:
    """argv after `run`; raises UsageError with one line for anything wrong."""
    module = argv[0] in ("-m", "--module")
    if module:
        argv = argv[1:]
        if not argv or argv[0].startswith("-"):
            raise UsageError("-m needs a module name: ddptui run -m pkg.train")
    ours, script_args = _split(argv)
    args = build_script_parser().parse_args(ours)
    _check_target(args.target, module)
    gpus, cpus = resolve_devices(args.gpus, args.cpus)
    return from_args(
        ScriptConfig, args, module=module, args=tuple(script_args), gpus=gpus, cpus=cpus,
        headless=args.headless or not sys.stdout.isatty(),
        metrics=tuple(_metric(m) for m in args.metric or ()),
        stacks_signal=_signal(args.stacks_signal))


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(ddptui's options with the target first, the script's arguments after --)."""
    if "--" in argv[1:]:
        i = argv.index("--", 1)
        ours, theirs = argv[:i], argv[i + 1:]
    else:
        ours, theirs = argv, []
    stray = [a for a in ours[1:] if a.startswith("-") and not _known(a)]
    if stray:
        raise UsageError(f"{stray[0]} is not a ddptui option: put the script's own arguments "
                         f"after --  (ddptui run {ours[0]} [ddptui options] -- {stray[0]} ...)")
    return ours, theirs


def _known(flag: str) -> bool:
    return flag.split("=", 1)[0] in {"-h", "--help", *flags(ScriptConfig)}


def _check_target(target: str, module: bool) -> None:
    if module:
        try:
            found = importlib.util.find_spec(target) is not None
        except (ImportError, ValueError):  # a parent package that is missing or broken
            found = False
        if not found:
            raise UsageError(f"module not found: {target} (ddptui run -m imports it from "
                             f"{os.getcwd()} and the installed packages)")
    elif not os.path.isfile(target):
        raise UsageError(f"no such script: {target}")


def _metric(text: str) -> tuple[str, str | None]:
    name, _, regex = text.partition("=")
    if not re.fullmatch(r"[A-Za-z_][\w.\-/]*", name):
        raise UsageError(f"bad --metric {text!r}: NAME or NAME=REGEX")
    if not regex:
        return name, None
    try:
        groups = re.compile(regex).groups
    except re.error as e:
        raise UsageError(f"bad --metric {text!r}: {e}") from None
    if groups != 1:
        raise UsageError(f"bad --metric {text!r}: the regex needs exactly one (group) around "
                         "the number")
    return name, regex


def _signal(name: str) -> int:
    name = name.upper()
    name = name if name.startswith("SIG") else "SIG" + name
    try:
        sig = signal.Signals[name]
    except KeyError:
        raise UsageError(f"bad --stacks-signal {name}: e.g. SIGUSR1 or SIGUSR2") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGINT, signal.SIGTERM):
        raise UsageError(f"--stacks-signal {name} cannot carry stacks: use SIGUSR1 or SIGUSR2")
    return int(sig)
