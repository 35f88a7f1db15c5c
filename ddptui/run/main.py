"""The run's own process: the run ddptui owns (the built-in loop's or a script's), served to the
dashboards that attach on its socket, its status lines on its output. The command line enters
here when this process is the run's: a dashboard started it, or --headless, or no terminal.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import replace

from ddptui.contract.console import ScriptConsole, run_headless
from ddptui.contract.monitor.service import Monitoring
from ddptui.contract.options.config import RunConfig
from ddptui.contract.options.monitor import MonitorPlan
from ddptui.contract.options.policy import RunPolicy
from ddptui.contract.options.script import ScriptConfig
from ddptui.contract.runs.registry import record_end, run_name
from ddptui.run.builtin.helpers import end_helpers
from ddptui.run.host.host import serve
from ddptui.run.owned import OwnedRun


def serve_builtin(config: RunConfig, log: str, policy: RunPolicy, hosted: str | None,
                  monitor: MonitorPlan | None = None) -> int:
    """`ddptui run MODEL`: the built-in loop's ranks."""
    from ddptui.run.builtin.supervisor import Supervisor

    return serve_headless(Supervisor(config, log, policy), hosted, monitor=monitor)


def serve_script(config: ScriptConfig, log: str, hosted: str | None) -> int:
    """`ddptui run SCRIPT.py` and `-m MODULE`: the script's ranks. In the run's own process
    (`hosted`) the ranks' output is the dashboards', not echoed here."""
    from ddptui.run.script.run import ScriptRun

    run = ScriptRun(replace(config, headless=not hosted), log)
    return serve_headless(run, hosted, ScriptConsole(run.state), config.monitor)


def serve_headless(run: OwnedRun, hosted: str | None, console=None,
                   monitor: MonitorPlan | None = None) -> int:
    """Run it in this process with status lines, open to dashboards (ddptui attach) while it
    runs, and to Prometheus and notifications with `monitor`; `hosted`: this is the run's own
    process (its lines go to its output file)."""
    # A closed terminal hangs up its whole foreground process group: the fork server, the ranks
    # forked from it and their workers inherit this, and only ddptui decides what a hang-up means.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    watched = Monitoring(monitor, run.state, run_name(run.log_path), run.log_path) \
        if monitor else None
    if watched:
        watched.start()
    host = serve(run, watched.url if watched else "")
    if host is not None and hosted:
        run.watched = host.watched
    try:
        if not hosted:
            print(f"ddptui: logging to {run.log_path}", file=sys.stderr if console else sys.stdout,
                  flush=True)
        return run_headless(run, console)
    finally:
        if watched is not None:
            watched.close()
        if host is not None:
            host.close()
            if run.log_lost:  # ls reads the end from the record where the log could not say it
                record_end(host.record, "failed", run.log_lost)
        end_helpers()
