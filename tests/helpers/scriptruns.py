"""A script's run as the dashboard's source (no screen), and a Pilot wait that says what the run
was doing when it fails."""

from __future__ import annotations

import dataclasses
import sys
import threading
import traceback

from ddptui.contract.options.script import parse_script_args
from ddptui.run.script.run import ScriptRun
from tests.helpers.runs import events


def script_run(args: list[str], log) -> ScriptRun:
    """`ddptui run ARGS` with its log at `log`, as a dashboard's source (not headless)."""
    config = parse_script_args([*args[:1], "--log", str(log), *args[1:]])
    return ScriptRun(dataclasses.replace(config, headless=False))


async def until_shown(pilot, predicate, timeout: float = 150, log=None) -> None:
    """Until predicate(); a failure shows the run's last events but steps (`log`): what the
    run was doing, for a wait that failed once in a loaded full suite and never alone."""
    for _ in range(int(timeout / 0.1)):
        if predicate():
            return
        await pilot.pause(0.1)
    last = [] if log is None else [e for e in events(log) if e["kind"] != "step"][-15:]
    frames = sys._current_frames()  # where the run's thread is: a hang names its call
    stuck = "".join(f"\n-- thread {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
                    for t in threading.enumerate() if t.name == "script-run" and t.ident in frames)
    raise AssertionError("the dashboard never showed it; the run's last events:\n"
                         + "\n".join(map(str, last)) + stuck)
