"""The console without a dashboard: progress and event lines as they come, a compact status line
every few seconds and a final summary. Used with --headless or when stdout is not a terminal.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import TYPE_CHECKING

from ddptui.contract.state.report import run_report
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.views import RunView
from ddptui.contract.wording import count

if TYPE_CHECKING:
    from ddptui.contract.state.source import RunSource

STATUS_EVERY_S = 5.0


def status_line(view: RunView) -> str:
    step, done = view.progress.step, view.progress.done
    loss = next((r.loss for r in view.ranks if r.loss is not None), None)
    devices = " ".join(_device(d) for d in view.devices)
    mins, secs = divmod(int(view.elapsed), 60)
    paused = "  PAUSED" if view.paused else ""
    troubled = [f"rank {r.rank} {r.state}" for r in view.ranks
                if r.state.is_troubled]
    trouble = f"  [{', '.join(troubled)}]" if troubled else ""
    return (f"[{mins:02d}:{secs:02d}] {view.progress.where} step {step} "
            f"({100 * done:.0f}%)  loss {'-' if loss is None else f'{loss:.4f}'}  "
            f"{view.throughput:,.0f} img/s  {devices}{paused}{trouble}")


def _device(d) -> str:
    """'gpu0 97%', 'r1 cpu 76%'; a reading that stopped coming says how old it is."""
    text = f"{d.key} {d.util:.0f}%" if d.util is not None else \
        f"r{d.rank} cpu {d.cpu_percent or 0:.0f}%"
    return f"{text} (last, {d.age:.0f} s ago)" if d.stale else text


def summary(view: RunView) -> str:
    """How the run ended, in one line: its outcome and time, the epochs it finished, its mean
    rate where measured, its best figure (validation accuracy, else the lowest epoch loss), and
    where its log is. The console's last line, and the line left after the dashboard closes."""
    if not view.ranks:  # an attach that no rank reported to, a run that never started one
        return f"{view.status}: no rank reported; log {view.meta.get('log')}"
    epochs = view.epochs
    rates = [e["samples_per_s"] for e in epochs if e["samples_per_s"] is not None]
    finished = len([e for e in epochs if not e["partial"]])
    losses = [e["train_loss"] for e in epochs if e["train_loss"] is not None]
    if view.best_val_acc is not None:
        best = f"best val_acc {100 * view.best_val_acc:.1f}%"
    else:
        best = f"best loss {min(losses):.4f}" if losses else "best val_acc -"
    rate = f", {sum(rates) / len(rates):,.0f} img/s mean" if rates else ""
    return (f"{view.status} in {view.elapsed:.1f} s: {count(finished, 'epoch')}{rate}, {best}; "
            f"log {view.meta.get('log')}")


class HeadlessConsole:
    """Prints new event lines of a RunState as they come and a status line now and then."""

    def __init__(self, state: RunState, out=sys.stdout):
        self.state, self.out = state, out
        self.seq = 0
        self.next_status = time.monotonic() + STATUS_EVERY_S

    def poll(self) -> None:
        for seq, _t, level, text, kind in self.state.lines_after(self.seq):
            self.seq = seq
            self.line(level, text, kind)
        now = time.monotonic()
        if now >= self.next_status:
            self.next_status = now + STATUS_EVERY_S
            view = self.state.view()
            if view.status == "running":
                print(status_line(view), file=self.out, flush=True)

    def line(self, level: str, text: str, kind: str) -> None:
        # Message lines name their level already (describe()); others get it here.
        named = level == "info" or f"{level}: " in text
        print(text if named else f"{level}: {text}", file=self.out, flush=True)

    def finish(self) -> None:
        self.next_status = float("inf")
        self.poll()
        print(summary(self.state.view()), file=self.out, flush=True)


class ScriptConsole(HeadlessConsole):
    """For a script's run: stdout is the ranks' own, as under torchrun; ddptui adds only its
    warnings (stalls, stacks, restarts) on stderr, and no status or summary lines."""

    def __init__(self, state: RunState, out=sys.stderr):
        super().__init__(state, out)
        self.next_status = float("inf")

    def line(self, level: str, text: str, kind: str) -> None:
        # How the run ended is said once, at the end, by the caller: a rank's crash, its error
        # and the run's failure would say it three times more.
        if level == "warning" and kind != "rank:crashed":
            print(f"ddptui: {text}", file=self.out, flush=True)

    def finish(self) -> None:
        self.poll()


def run_headless(run: RunSource, console: HeadlessConsole | None = None) -> int:
    """Start `run`, print its lines until it ends, and return its exit code."""
    console = console or HeadlessConsole(run.state)
    _stop_on_signals(lambda code: run.stop(code=code))
    run.start()
    while not run.done.wait(0.25):
        console.poll()
    console.finish()
    print_verdict(run.state, console.out)
    code = run.exit_code
    view = run.state.view()
    if code == 2 and view.status != "failed":  # bad input to ddptui, not a script's exit
        print(f"ddptui: error: {view.reason}", file=sys.stderr)
    elif code not in (0, None) and view.reason:
        print(f"ddptui: {view.status}: {view.reason}", file=sys.stderr)
    return 1 if code is None else code


def print_verdict(state: RunState, out=sys.stdout) -> None:
    """The run's verdict, after its exit line: where the time went, who was slow and why (one
    that cannot be made is one line; the run's exit code stands)."""
    try:
        lines = run_report(state)[1]
    except Exception as e:
        lines = [f"ddptui: no verdict for this run: {type(e).__name__}: {e}"]
    if lines:
        print("\n".join(lines), file=out, flush=True)


def _stop_on_signals(stop) -> None:
    """Ctrl-C -> 130, SIGTERM -> 143, SIGHUP -> 129 (the headless console's; the dashboard's run
    outlives its terminal): an orderly stop; a second one is immediate."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stop(128 + signum))
