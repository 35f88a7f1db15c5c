"""`ddptui report RUN` (a run's verdict, at any time after it ended or while it runs) and
`ddptui compare RUN_A RUN_B` (two runs side by side: the question after changing workers, batch
size or AMP), both read from the runs' logs.
"""

from __future__ import annotations

import argparse
import os
import sys

from ddptui.contract.options.errors import UsageError
from ddptui.contract.protocol.codec import dumps
from ddptui.contract.protocol.steptime import PHASES
from ddptui.contract.state.verdicts import LABELS


def cmd_report(args: argparse.Namespace) -> int:
    report, lines = _report(args.run)
    print(dumps(report, indent=1) if args.json else "\n".join(lines))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    a, b = _report(args.run_a)[0], _report(args.run_b)[0]
    if args.json:
        print(dumps({"a": a, "b": b}, indent=1))
    else:
        print("\n".join(compare_lines(a, b)))
    return 0


def _report(run: str) -> tuple[dict, list[str]]:
    """A run's verdict from its log: a log's path, or a run's name (or a prefix of it) as
    `ddptui ls` lists it."""
    from ddptui.contract.state.report import run_report
    from ddptui.dashboard.sources.replay import Replay, not_a_log

    path = run if os.path.isfile(run) else _log_of(run)
    why = not_a_log(path)
    if why:
        raise UsageError(f"{path} is not a ddptui log: {why}")
    replay = Replay(path, speed=0)
    replay.start()
    replay.done.wait()
    if replay.bad_lines:
        print(f"ddptui: warning: {replay.skipped()}", file=sys.stderr)
    report, lines = run_report(replay.state, logged=False)  # figures made here, not trusted
    return {**report, "log": path}, lines


def _log_of(name: str) -> str:
    from ddptui.contract.runs.registry import runs
    from ddptui.contract.safe_text import escaped

    try:
        found = runs()
    except OSError as e:
        raise UsageError(str(e)) from None
    matches = [r for r in found if r.name == name] or [r for r in found if r.name.startswith(name)]
    if len(matches) != 1:
        raise UsageError(f"no log file and no run of yours named {escaped(name)} (ddptui ls lists "
                         "them)" if not matches else f"{escaped(name)} names {len(matches)} runs: "
                         + ", ".join(r.name for r in matches))
    return matches[0].log


def compare_lines(a: dict, b: dict) -> list[str]:
    """Two reports side by side, a row a figure, with B against A where both have it."""
    rows = [("", _name(a), _name(b), "B vs A"),
            ("status", a["status"], b["status"], ""),
            ("ranks", a["ranks"], b["ranks"], ""),
            _figure("img/s", a["samples_per_s"], b["samples_per_s"], "{:,.1f}"),
            _figure("ms a step", a["step_ms"], b["step_ms"], "{:,.1f}")]
    for phase in PHASES:
        if phase in a["phases"] or phase in b["phases"]:
            rows.append(_figure(f"  {LABELS[phase]}", a["phases"].get(phase),
                                b["phases"].get(phase), "{:.1%}", points=True))
    for i in range(max(len(a["epochs"]), len(b["epochs"]))):
        ea, eb = (r["epochs"][i] if i < len(r["epochs"]) else {} for r in (a, b))
        rows.append(_figure(f"epoch {i} loss", ea.get("train_loss"), eb.get("train_loss"),
                            "{:.4f}"))
        if ea.get("val_acc") is not None or eb.get("val_acc") is not None:
            rows.append(_figure(f"epoch {i} val_acc", ea.get("val_acc"), eb.get("val_acc"),
                                "{:.1%}", points=True))
    rows.append(_figure("memory peak MiB", a["memory_peak"], b["memory_peak"], "{:,.0f}"))
    rows.append(("slowest", _slowest(a), _slowest(b), ""))
    for key in sorted(set(a["settings"]) | set(b["settings"])):
        va, vb = a["settings"].get(key, "-"), b["settings"].get(key, "-")
        rows.append((key, str(va), str(vb), "changed" if va != vb else ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    return ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]


def _figure(label: str, a, b, form: str, points: bool = False) -> tuple:
    def show(v) -> str:
        return "-" if v is None else form.format(v)

    if a is None or b is None:
        change = ""
    elif points:
        change = f"{100 * (b - a):+.1f} points"
    else:
        change = f"{b / a - 1:+.1%}" if a else ""
    return label, show(a), show(b), change


def _name(report: dict) -> str:
    return f"{report['run'] or 'run'} ({os.path.basename(report['log'] or '')})"


def _slowest(report: dict) -> str:
    slowest = report["slowest"]
    return f"rank {slowest['rank']}: {slowest['phase']}" if slowest else "none"
