"""The commands that look without starting anything: ls (this user's runs on this machine),
gpus, and replay (a recorded log's dashboard again, or its epochs as CSV).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ddptui.contract.options.errors import UsageError


def cmd_ls(_args: argparse.Namespace) -> int:
    from ddptui.contract.runs.registry import runs
    from ddptui.contract.safe_text import escaped

    try:
        found = runs(warn=_warn)
    except OSError as e:  # the folder refused (a link, another user's), or unreadable
        raise UsageError(str(e)) from None
    if not found:
        print("no runs of this user on this machine")
        return 0
    now = time.time()
    rows = [("NAME", "STATE", "PID", "RANKS", "AGE", "WHAT", "LOG")] + [
        (r.name, escaped(r.state), str(r.pid), str(r.ranks), _age(now - r.started),
         escaped(r.what)[:40], escaped(r.log)) for r in found]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    metrics = any(r.metrics for r in found)  # the endpoints, where a run serves one
    ends = ["METRICS"] + [escaped(r.metrics) or "-" for r in found]
    for row, end in zip(rows, ends, strict=True):
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:6], widths, strict=True)) + "  " +
              (row[6].ljust(max(len(r[6]) for r in rows)) + "  " + end if metrics else row[6]))
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def cmd_gpus(_args: argparse.Namespace) -> int:
    from ddptui.contract.nvml import format_gpus, list_gpus

    print(format_gpus(list_gpus()))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.file):
        raise UsageError(f"no such log: {args.file}")
    if args.speed < 0:
        raise UsageError(f"--speed must be 0 or more, got {args.speed}")
    from ddptui.dashboard.sources.replay import Replay, not_a_log

    why = not_a_log(args.file)
    if why:
        raise UsageError(f"{args.file} is not a ddptui log: {why}")
    if args.csv is not None:
        return _epochs_csv(args.file, args.csv)

    replay = Replay(args.file, speed=args.speed)
    if args.headless or not sys.stdout.isatty():
        from ddptui.contract.console import run_headless

        return run_headless(replay)
    from ddptui.dashboard.view.app import DashboardApp

    DashboardApp(replay).run()
    return 0


def _epochs_csv(log: str, target: str) -> int:
    from ddptui.contract.wording import count
    from ddptui.dashboard.sources.export import write_epochs_csv

    if target == "-":
        write_epochs_csv(log, sys.stdout, _warn)
        return 0
    try:
        with open(target, "w", newline="") as out:
            rows = write_epochs_csv(log, out, _warn)
    except OSError as e:
        raise UsageError(f"cannot write {target}: {e.strerror or e}") from None
    print(f"ddptui: {count(rows, 'epoch row')} written to {target}", file=sys.stderr)
    return 0


def _warn(text: str) -> None:
    print(f"ddptui: warning: {text}", file=sys.stderr)
