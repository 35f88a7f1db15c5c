"""The `ddptui` command line: parses and validates everything before any process starts (bad
input is one line on stderr and exit code 2), then enters the side this process is: the run's
own (ddptui/run/main.py) or a dashboard's (ddptui/dashboard/main.py, browse.py for ls, gpus
and replay). Neither side is imported before that; torch never is.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ddptui import __version__
from ddptui.contract import bytecode
from ddptui.contract.keys import keys_lines
from ddptui.contract.monitor.service import notify_test
from ddptui.contract.observe.endings import JOB_GRACE_S
from ddptui.contract.options.argtypes import positive_float
from ddptui.contract.options.config import DeviceOptions
from ddptui.contract.options.devices import resolve_devices
from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.monitor import MonitorOptions, monitor_plan
from ddptui.contract.options.parser import Parser, add_sections, from_args
from ddptui.contract.options.policy import RunPolicy
from ddptui.contract.options.script import (
    DETACH_HELP,
    DETACH_OR_HEADLESS,
    is_script_form,
    parse_script_args,
)
from ddptui.contract.options.training import add_training_options, config_from_args
from ddptui.contract.options.web import add_web_parser
from ddptui.contract.runs.registry import HOST_ENV, default_log_path
from ddptui.contract.stalls.scripts import STALL_S

EXIT_PIPE = 141  # 128 + SIGPIPE: whoever read our output stopped (| head), as for any command
ATTACH_PORT = 29600
NOTHING_TO_RUN = ("say what to train: a model (ddptui run resnet18), your own script (ddptui run "
                  "train.py) or module (ddptui run -m pkg.train); ddptui run --help")
HEADLESS_HELP = "no dashboard: status lines on stdout (automatic when not a terminal)"

EXAMPLES = f"""examples:
  ddptui run resnet18                         # all GPUs (or 2 CPU ranks), built-in shapes data
  ddptui run resnet18 --gpus 0,1 --amp bf16 --channels-last
  ddptui run resnet50 --gpus all --data imagefolder:/data/imagenet --workers 12
  ddptui run mypkg.models:get_model --data mypkg.data:get_dataset --cpus 2
  ddptui run resnet18 --headless --epochs 1 --log runs/quick.jsonl
  ddptui run resnet50 --gpus all --detach     # in the background: prints its name and log
  ddptui ls                                   # your runs: running, and how the others ended
  ddptui web --control                        # the newest run's dashboard in browser tabs
  ddptui attach                               # the newest run's dashboard again (or: attach NAME)
  ddptui attach --listen 0.0.0.0:29600        # ranks of torchrun/srun jobs run with --report
  torchrun ... -m ddptui.wrap train.py ARGS   # ... or an unmodified script (DDPTUI_REPORT)
  ddptui gpus                                 # what NVML sees, in nvidia-smi order
  ddptui replay runs/2026-11-22T10-00-00.jsonl --speed 10
  ddptui replay runs/2026-11-22T10-00-00.jsonl --csv epochs.csv   # the epochs table as CSV
  ddptui report runs/2026-11-22T10-00-00.jsonl   # its verdict: where the step time went
  ddptui compare RUN_A RUN_B                  # two runs side by side
  ddptui run train.py --gpus 0,1 -- --lr 0.1  # your own torchrun script, no code change
  ddptui run -m mypkg.train --cpus 2 -- ARGS  # ... or module (ddptui run train.py --help)

keys in the dashboard:
{chr(10).join(keys_lines())}
exit codes: 0 done (or d: the run goes on), 1 training failed, 2 bad usage or input (one line
  on stderr), 130 Ctrl-C or q, 143 SIGTERM, 129 SIGHUP with --headless (the dashboard's run
  has a process of its own: a closed terminal leaves it going), 141 when whoever reads the
  output stops (| head); your own script: the failing rank's own exit code, passed on (128+N
  for a rank killed by signal N)
environment: DDPTUI_PYCACHE=0|1 turns the ranks' bytecode cache off or on (on by default
  where Python may not write bytecode); DDPTUI_BELL=0 keeps the dashboard from ringing the
  terminal's bell when a rank stalls or crashes; ranks of a job over 16 send their telemetry
  folded once a second (DDPTUI_ROLLUP_S=S: another span, 0: every step event), and attach's log
  keeps it whole for its first 300 s (DDPTUI_LOG_FULL_S) (docs/cluster.md); DDPTUI_STEP_CLOCK=0
  turns off the phases of each step (to measure what they cost; docs/dashboard.md)"""


def build_parser() -> Parser:
    parser = Parser(prog="ddptui", description="Launch PyTorch DDP training and steer it live.",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ddptui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    run = sub.add_parser("run", help="start one rank per GPU (or CPU rank) and watch it",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                         hints={"the following arguments are required: model": NOTHING_TO_RUN})
    groups = add_training_options(run, DeviceOptions, RunPolicy, MonitorOptions)
    groups["launch"].add_argument("--headless", action="store_true", help=HEADLESS_HELP)
    groups["launch"].add_argument("--detach", action="store_true", help=DETACH_HELP)
    attach = sub.add_parser("attach", help="the dashboard again on a run of yours (by name, a "
                            "prefix of it, or the newest), or with --listen for ranks started by "
                            "torchrun or srun (docs/cluster.md)")
    attach.add_argument("run", nargs="?", metavar="RUN",
                        help="a run `ddptui ls` lists as running: its name or a prefix of it "
                        "(default: the newest)")
    attach.add_argument("--listen", nargs="?", const=f"127.0.0.1:{ATTACH_PORT}", metavar="HOST:PORT",
                        help="listen for ranks started by torchrun or srun with --report, or "
                        f"under python -m ddptui.wrap (alone: 127.0.0.1:{ATTACH_PORT}; "
                        "0.0.0.0:PORT for other machines)")
    attach.add_argument("--headless", action="store_true",
                        help=HEADLESS_HELP)
    attach.add_argument("--read-only", action="store_true",
                        help="watch only: the steering keys are dimmed and say why (t, g, ? "
                        "work; q leaves) and the run refuses any order but stacks (ddptui "
                        "web's tabs without --control)")
    attach.add_argument("--log", default=None, metavar="FILE.jsonl",
                        help="telemetry log (default runs/attach-<time>.jsonl); a going job's "
                        "log is continued, drawn at once as kept beside it (NAME.state.json)")
    attach.add_argument("--stall-after", type=positive_float, default=STALL_S, metavar="S",
                        help="ranks under python -m ddptui.wrap: flag one stalled after S "
                        f"seconds stopped, idle or silent (default {STALL_S:.0f}); one that "
                        "stops reporting is unreachable after 5 s")
    attach.add_argument("--grace", type=positive_float, default=JOB_GRACE_S, metavar="S",
                        help="K ends the whole job: each wrapped rank gets SIGTERM, and SIGKILL "
                        f"if it is still there S seconds later (default {JOB_GRACE_S:.0f})")
    add_sections(attach, MonitorOptions)
    add_web_parser(sub)
    sub.add_parser("ls", help="this user's runs on this machine: running, and how the others "
                   "ended")
    sub.add_parser("gpus", help="list the GPUs NVML sees")
    replay = sub.add_parser("replay", help="the dashboard again, from a recorded JSONL log")
    replay.add_argument("file", metavar="FILE.jsonl")
    replay.add_argument("--speed", type=float, default=1.0,
                        help="playback speed (0: as fast as possible)")
    replay.add_argument("--headless", action="store_true", help="print the events instead")
    replay.add_argument("--csv", nargs="?", const="-", metavar="FILE",
                        help="write its epochs table as CSV to FILE (or stdout) and exit")
    report = sub.add_parser("report", help="a run's verdict: where its step time went, its "
                            "slowest rank and why, memory, restarts, stalls, settings")
    report.add_argument("run", metavar="RUN", help="its log (FILE.jsonl), or its name as ddptui "
                        "ls lists it (or a prefix of it)")
    report.add_argument("--json", action="store_true", help="the figures as JSON, for tools")
    compare = sub.add_parser("compare", help="two runs side by side: img/s, phase shares, loss "
                             "at each epoch, memory, settings")
    compare.add_argument("run_a", metavar="RUN_A", help="a log or a run's name (as for report)")
    compare.add_argument("run_b", metavar="RUN_B", help="the other")
    compare.add_argument("--json", action="store_true", help="both reports as JSON")
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    gpus, cpus = resolve_devices(args.gpus, args.cpus)
    if args.report:
        raise UsageError("ddptui run shows its own dashboard: --report is for ranks started by "
                         "torchrun or srun (see docs/cluster.md)")
    if args.strategy == "dp" and not gpus:
        raise UsageError("--strategy dp needs GPUs: DataParallel splits each batch across them")
    config = config_from_args(args, gpus=gpus, cpus=cpus)
    if args.detach and args.headless:
        raise UsageError(DETACH_OR_HEADLESS)
    # Checked here, before a dashboard starts the run's own process (which serves it).
    monitor = monitor_plan(from_args(MonitorOptions, args))
    if monitor and monitor.notify_test:
        return notify_test(monitor, config.model.name)
    log = config.telemetry.log or args.hosted or default_log_path()
    if not args.hosted and (args.detach or (not args.headless and sys.stdout.isatty())):
        from ddptui.dashboard.main import in_background

        return in_background(args.argv, log, args.detach)
    from ddptui.run.main import serve_builtin

    return serve_builtin(config, log, from_args(RunPolicy, args), args.hosted, monitor)


def cmd_run_script(argv: list[str], hosted: str | None) -> int:
    """`ddptui run SCRIPT.py ... -- args` and `ddptui run -m MODULE ...`: the script's ranks."""
    config = parse_script_args(argv)
    if config.monitor and config.monitor.notify_test:
        return notify_test(config.monitor, config.target)
    log = config.log or hosted or default_log_path()
    if not hosted and (config.detach or not config.headless):
        from ddptui.dashboard.main import in_background

        return in_background(["run", *argv], log, config.detach)
    from ddptui.run.main import serve_script

    return serve_script(config, log, hosted)


def cmd_attach(args: argparse.Namespace) -> int:
    from ddptui.dashboard.main import attach

    return attach(args)


def cmd_web(args: argparse.Namespace) -> int:
    from ddptui.dashboard.web.command import cmd_web as web

    return web(args)


def cmd_browse(args: argparse.Namespace) -> int:
    """ls, gpus and replay: ddptui/browse.py."""
    from ddptui import browse

    return {"ls": browse.cmd_ls, "gpus": browse.cmd_gpus, "replay": browse.cmd_replay}[
        args.command](args)


def cmd_reports(args: argparse.Namespace) -> int:
    """report and compare: ddptui/reports.py."""
    from ddptui import reports

    return (reports.cmd_report if args.command == "report" else reports.cmd_compare)(args)


def main(argv: list[str] | None = None) -> int:
    bytecode.enable()  # before textual, and before any rank starts
    argv = sys.argv[1:] if argv is None else argv
    # In the run's own process: the log that its foreground claimed (not the ranks' business).
    hosted = os.environ.pop(HOST_ENV, None)
    if is_script_form(argv):
        return _guarded(lambda: cmd_run_script(argv[1:], hosted))
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # the run's own process is started with the same command line
    args.hosted = hosted
    handlers = {"run": cmd_run, "attach": cmd_attach, "gpus": cmd_browse,
                "replay": cmd_browse, "ls": cmd_browse, "web": cmd_web, "report": cmd_reports,
                "compare": cmd_reports}
    if args.command not in handlers:
        parser.print_help()
        return 2
    return _guarded(lambda: handlers[args.command](args))


def _guarded(handler: Callable[[], int]) -> int:
    try:
        return handler()
    except UsageError as e:
        print(f"ddptui: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Whoever read our output stopped (| head): as a command killed by SIGPIPE, quietly.
        # stdout points at nothing now, so that its flush at exit raises no second error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
