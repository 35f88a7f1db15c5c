"""The `ddptui` command: run and attach here, ls, gpus and replay in browse.py. Parses and
validates everything before any process starts, so bad input is one line on stderr and exit
code 2; torch is never imported here.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ddptui import __version__, browse
from ddptui.contract.observe.endings import JOB_GRACE_S
from ddptui.contract.options.argtypes import positive_float
from ddptui.contract.options.config import DeviceOptions
from ddptui.contract.options.devices import resolve_devices
from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.parser import Parser, from_args
from ddptui.contract.options.training import add_training_options, config_from_args
from ddptui.contract.stalls.scripts import STALL_S
from ddptui.dashboard.background import HOST_ENV
from ddptui.dashboard.view.keys import keys_lines
from ddptui.dashboard.web.command import add_web_parser, cmd_web
from ddptui.run.builtin import bytecode
from ddptui.run.builtin.policy import RunPolicy
from ddptui.run.outcome import EXIT_PIPE
from ddptui.run.script.options import DETACH_HELP, DETACH_OR_HEADLESS

if TYPE_CHECKING:
    from ddptui.run.owned import OwnedRun

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
  torchrun ... -m ddptui.rank.wrap train.py ARGS   # ... or an unmodified script (DDPTUI_REPORT)
  ddptui gpus                                 # what NVML sees, in nvidia-smi order
  ddptui replay runs/2026-11-22T10-00-00.jsonl --speed 10
  ddptui replay runs/2026-11-22T10-00-00.jsonl --csv epochs.csv   # the epochs table as CSV
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
  where Python may not write bytecode)"""


def build_parser() -> Parser:
    parser = Parser(prog="ddptui", description="Launch PyTorch DDP training and steer it live.",
                    epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"ddptui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    run = sub.add_parser("run", help="start one rank per GPU (or CPU rank) and watch it",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
                         hints={"the following arguments are required: model": NOTHING_TO_RUN})
    groups = add_training_options(run, DeviceOptions, RunPolicy)
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
                        f"under python -m ddptui.rank.wrap (alone: 127.0.0.1:{ATTACH_PORT}; "
                        "0.0.0.0:PORT for other machines)")
    attach.add_argument("--headless", action="store_true",
                        help=HEADLESS_HELP)
    attach.add_argument("--read-only", action="store_true",
                        help="watch only: the steering keys are dimmed and say why (t, g, ? "
                        "work; q leaves) and the run refuses any order but stacks (ddptui "
                        "web's tabs without --control)")
    attach.add_argument("--log", default=None, metavar="FILE.jsonl",
                        help="telemetry log (default runs/attach-<time>.jsonl)")
    attach.add_argument("--stall-after", type=positive_float, default=STALL_S, metavar="S",
                        help="ranks under python -m ddptui.rank.wrap: flag one stalled after S "
                        f"seconds stopped, idle or silent (default {STALL_S:.0f}); one that "
                        "stops reporting is unreachable after 5 s")
    attach.add_argument("--grace", type=positive_float, default=JOB_GRACE_S, metavar="S",
                        help="K ends the whole job: each wrapped rank gets SIGTERM, and SIGKILL "
                        f"if it is still there S seconds later (default {JOB_GRACE_S:.0f})")
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
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    gpus, cpus = resolve_devices(args.gpus, args.cpus)
    if args.report:
        raise UsageError("ddptui run shows its own dashboard: --report is for ranks started by "
                         "torchrun or srun (see docs/cluster.md)")
    if args.strategy == "dp" and not gpus:
        raise UsageError("--strategy dp needs GPUs: DataParallel splits each batch across them")
    config = config_from_args(args, gpus=gpus, cpus=cpus)
    from ddptui.contract.runs.registry import default_log_path

    log = config.telemetry.log or args.hosted or default_log_path()
    if args.detach and args.headless:
        raise UsageError(DETACH_OR_HEADLESS)
    if not args.hosted and (args.detach or (not args.headless and sys.stdout.isatty())):
        return _background(args.argv, log, args.detach)
    from ddptui.run.builtin.supervisor import Supervisor

    return serve_headless(Supervisor(config, log, from_args(RunPolicy, args)), args.hosted)


def cmd_run_script(argv: list[str], hosted: str | None) -> int:
    """`ddptui run SCRIPT.py ... -- args` and `ddptui run -m MODULE ...`: the script's ranks."""
    from ddptui.run.script.options import parse_script_args

    config = parse_script_args(argv)
    from ddptui.contract.runs.registry import default_log_path

    log = config.log or hosted or default_log_path()
    if not hosted and (config.detach or not config.headless):
        return _background(["run", *argv], log, config.detach)
    from ddptui.dashboard.view.headless import ScriptConsole
    from ddptui.run.script.run import ScriptRun

    # The run's own process serves dashboards: the ranks' output is theirs, not echoed here.
    run = ScriptRun(replace(config, headless=not hosted), log)
    return serve_headless(run, hosted, ScriptConsole(run.state))


def _background(argv: list[str], log: str, detach: bool) -> int:
    from ddptui.dashboard import background

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


def serve_headless(run: OwnedRun, hosted: str | None, console=None) -> int:
    """Run it in this process with status lines, open to dashboards (ddptui attach) while it
    runs; `hosted`: this is the run's own process (its lines go to its output file)."""
    from ddptui.contract.socket.host import serve
    from ddptui.run.builtin.helpers import end_helpers

    # A closed terminal hangs up its whole foreground process group: the fork server, the ranks
    # forked from it and their workers inherit this, and only ddptui decides what a hang-up means.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    host = serve(run)
    if host is not None and hosted:
        run.watched = host.watched
    try:
        if not hosted:
            print(f"ddptui: logging to {run.log_path}", file=sys.stderr if console else sys.stdout,
                  flush=True)
        from ddptui.dashboard.view.headless import run_headless

        return run_headless(run, console)
    finally:
        if host is not None:
            host.close()
            if run.log_lost:  # ls reads the end from the record where the log could not say it
                from ddptui.contract.runs.registry import record_end

                record_end(host.record, "failed", run.log_lost)
        end_helpers()


def has_screen() -> bool:
    """Whether a dashboard can draw: a terminal, or a browser tab (textual-serve's driver)."""
    return sys.stdout.isatty() or "web_driver" in os.environ.get("TEXTUAL_DRIVER", "")


def cmd_attach(args: argparse.Namespace) -> int:
    if args.listen is None:
        return _attach_run(args.run, args.headless or not has_screen(), args.read_only)
    if args.read_only:
        raise UsageError("--read-only is for a run of yours, not --listen")
    if args.run is not None:
        raise UsageError(f"attach {args.run} --listen: a run of yours, or ranks of torchrun or "
                         "srun on --listen, not both")
    from ddptui.contract.channel import load_key, parse_address

    try:
        address = parse_address(args.listen, "--listen")
        key, source = load_key(create=True)
    except ValueError as e:  # a bad address, or NoKey
        raise UsageError(str(e)) from None
    log = args.log or os.path.join("runs", time.strftime("attach-%Y-%m-%dT%H-%M-%S.jsonl"))
    from ddptui.contract.options.training import check_writable_file

    check_writable_file(log, "--log")
    from ddptui.dashboard.sources.attach import Attach

    try:
        attach = Attach(address, key, log, source, args.stall_after, args.grace)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.listen}: {e.strerror}") from None
    headless = args.headless or not sys.stdout.isatty()
    if headless:
        print(f"ddptui: listening on {args.listen} (key: {source}); start ranks with "
              f"--report {args.listen}; logging to {log}", flush=True)
        from ddptui.dashboard.view.headless import run_headless

        return run_headless(attach)
    from ddptui.dashboard.view.app import DashboardApp

    DashboardApp(attach).run()
    attach.stop(code=0)
    return 0


def _attach_run(name: str | None, headless: bool, read_only: bool = False) -> int:
    """The dashboard (or its lines) on a run of this user's, from its own process."""
    from ddptui.contract.runs.registry import find
    from ddptui.contract.socket.viewer import RunGone
    from ddptui.contract.socket.viewers import Refused
    from ddptui.dashboard import background

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


def main(argv: list[str] | None = None) -> int:
    bytecode.enable()  # before textual, and before any rank starts
    argv = sys.argv[1:] if argv is None else argv
    from ddptui.run.script.options import is_script_form

    # In the run's own process: the log that its foreground claimed (not the ranks' business).
    hosted = os.environ.pop(HOST_ENV, None)
    if is_script_form(argv):
        return _guarded(lambda: cmd_run_script(argv[1:], hosted))
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv  # the run's own process is started with the same command line
    args.hosted = hosted
    handlers = {"run": cmd_run, "attach": cmd_attach, "gpus": browse.cmd_gpus,
                "replay": browse.cmd_replay, "ls": browse.cmd_ls, "web": cmd_web}
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
