"""A dashboard's process: `ddptui run` in a terminal starts the run's own process and watches
it; `ddptui attach` watches a run of yours again, or the ranks of torchrun and srun jobs. The
command line enters here for every screen and status line that is not the run's own.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ddptui.contract.channel import load_key, parse_address
from ddptui.contract.console import run_headless
from ddptui.contract.monitor.service import Monitoring, notify_test
from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.monitor import MonitorOptions, monitor_plan
from ddptui.contract.options.parser import from_args
from ddptui.contract.options.training import check_writable_file
from ddptui.contract.runs.registry import find, run_name
from ddptui.contract.socket.viewer import RunGone
from ddptui.contract.socket.viewers import Refused
from ddptui.dashboard import background


def in_background(argv: list[str], log: str, detach: bool) -> int:
    """`ddptui run` with a terminal (or --detach): the run in a process of its own, this one
    its dashboard (or gone at once, saying how to come back)."""
    try:
        proc, viewer = background.launch(argv, log)
    except background.NotStarted as e:  # its own words: bad input, most often
        print("\n".join(e.said) or f"ddptui: the run's process ended ({e.code})", file=sys.stderr)
        return e.code
    if detach:
        viewer.close()
        print(f"ddptui: {viewer.name} runs in the background (pid {viewer.pid}); "
              f"{background.comeback(viewer)}", flush=True)
        return 0
    return background.watch(viewer, proc)


def has_screen() -> bool:
    """Whether a dashboard can draw: a terminal, or a browser tab (textual-serve's driver)."""
    return sys.stdout.isatty() or "web_driver" in os.environ.get("TEXTUAL_DRIVER", "")


def attach(args: argparse.Namespace) -> int:
    """`ddptui attach [RUN]`, or `--listen` for ranks that report from torchrun or srun."""
    monitor = monitor_plan(from_args(MonitorOptions, args))
    if monitor and monitor.notify_test:
        return notify_test(monitor, "ddptui attach")
    if args.listen is None:
        if monitor:
            raise UsageError("--metrics and --notify go with ddptui run (the run serves them) "
                             "or attach --listen")
        return _attach_run(args.run, args.headless or not has_screen(), args.read_only)
    if args.read_only:
        raise UsageError("--read-only is for a run of yours, not --listen")
    if args.run is not None:
        raise UsageError(f"attach {args.run} --listen: a run of yours, or ranks of torchrun or "
                         "srun on --listen, not both")
    try:
        address = parse_address(args.listen, "--listen")
        key, source = load_key(create=True)
    except ValueError as e:  # a bad address, or NoKey
        raise UsageError(str(e)) from None
    log = args.log or os.path.join("runs", time.strftime("attach-%Y-%m-%dT%H-%M-%S.jsonl"))
    check_writable_file(log, "--log")
    from ddptui.dashboard.sources.attach import Attach

    try:
        job = Attach(address, key, log, source, args.stall_after, args.grace)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.listen}: {e.strerror}") from None
    watched = Monitoring(monitor, job.state, run_name(log), log) if monitor else None
    if watched:
        watched.start()
    try:
        if args.headless or not sys.stdout.isatty():
            print(f"ddptui: listening on {args.listen} (key: {source}); start ranks with "
                  f"--report {args.listen}; logging to {log}", flush=True)
            return run_headless(job)
        from ddptui.dashboard.view.app import DashboardApp

        DashboardApp(job).run()
        job.stop(code=0)
        return 0
    finally:
        if watched is not None:
            watched.close()


def _attach_run(name: str | None, headless: bool, read_only: bool = False) -> int:
    """The dashboard (or its lines) on a run of this user's, from its own process."""
    try:
        record = find(name)
    except (LookupError, OSError) as e:
        raise UsageError(str(e)) from None
    try:
        viewer = background.attach(record.pid, read_only)
    except (Refused, RunGone) as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot reach {record.name}: {e.strerror or e}") from None
    return background.follow(viewer) if headless else background.watch(viewer)
