"""The `ddptui` command: run, gpus, replay. Parses and validates everything before any process
starts, so bad input is one line on stderr and exit code 2; torch is never imported here.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from ddptui import __version__
from ddptui.options.argtypes import positive_float
from ddptui.options.config import DeviceOptions
from ddptui.options.errors import UsageError
from ddptui.options.parser import Parser, from_args
from ddptui.options.training import add_training_options, config_from_args
from ddptui.run import bytecode
from ddptui.run.policy import RunPolicy
from ddptui.script.options import JOB_GRACE_S, STALL_S
from ddptui.view.keys import keys_lines

if TYPE_CHECKING:
    from ddptui.run.owned import OwnedRun

EXIT_GRACE_S = 3.0  # after a stop signal: the app's own exit, before the process is ended
STOP_GRACE_S = 25.0  # after the dashboard is gone: the run's orderly stop, before ending it
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
  ddptui attach --listen 0.0.0.0:29600        # ranks of torchrun/srun jobs run with --report
  torchrun ... -m ddptui.wrap train.py ARGS   # ... or an unmodified script (DDPTUI_REPORT)
  ddptui gpus                                 # what NVML sees, in nvidia-smi order
  ddptui replay runs/2026-11-22T10-00-00.jsonl --speed 10
  ddptui replay runs/2026-11-22T10-00-00.jsonl --csv epochs.csv   # the epochs table as CSV
  ddptui run train.py --gpus 0,1 -- --lr 0.1  # your own torchrun script, no code change
  ddptui run -m mypkg.train --cpus 2 -- ARGS  # ... or module (ddptui run train.py --help)

keys in the dashboard:
{chr(10).join(keys_lines())}
exit codes: 0 done, 1 training failed, 2 bad usage or input (one line on stderr), 130 Ctrl-C
  or q, 143 SIGTERM, 129 SIGHUP with --headless (a run whose terminal closes goes on
  to its end); your own script: the failing rank's own exit code, passed on (128+N for a rank
  killed by signal N)
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
    attach = sub.add_parser("attach", help="the dashboard for ranks started by torchrun or srun "
                            "with --report, or under python -m ddptui.wrap (docs/cluster.md)")
    attach.add_argument("--listen", default=f"127.0.0.1:{ATTACH_PORT}", metavar="HOST:PORT",
                        help=f"where ranks connect (default 127.0.0.1:{ATTACH_PORT}; "
                        "0.0.0.0:PORT for other machines)")
    attach.add_argument("--headless", action="store_true",
                        help=HEADLESS_HELP)
    attach.add_argument("--log", default=None, metavar="FILE.jsonl",
                        help="telemetry log (default runs/attach-<time>.jsonl)")
    attach.add_argument("--stall-after", type=positive_float, default=STALL_S, metavar="S",
                        help="ranks under python -m ddptui.wrap: flag one stalled after S "
                        f"seconds stopped, idle or silent (default {STALL_S:.0f}); one that "
                        "stops reporting is unreachable after 5 s")
    attach.add_argument("--grace", type=positive_float, default=JOB_GRACE_S, metavar="S",
                        help="K ends the whole job: each wrapped rank gets SIGTERM, and SIGKILL "
                        f"if it is still there S seconds later (default {JOB_GRACE_S:.0f})")
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


def resolve_devices(gpus: str | None, cpus: int | None, count: int | None = None):
    """(--gpus, --cpus) -> (tuple of GPU indices or None, CPU rank count or None)."""
    if gpus is not None and cpus is not None:
        raise UsageError("use either --gpus or --cpus, not both")
    if cpus is not None:
        return None, cpus
    if count is None:
        from ddptui.run.nvml import gpu_count

        count = gpu_count()
    if gpus is None:
        return (tuple(range(count)), None) if count else (None, 2)
    if count == 0:
        raise UsageError("no NVIDIA GPU found: --gpus needs one (use --cpus N for CPU ranks)")
    if gpus.strip() == "all":
        return tuple(range(count)), None
    try:
        chosen = tuple(int(x) for x in gpus.split(","))
    except ValueError:
        raise UsageError(f"bad --gpus {gpus!r}: use indices like 0,1 or 'all'") from None
    if len(set(chosen)) != len(chosen):
        raise UsageError(f"bad --gpus {gpus!r}: an index appears twice")
    bad = [i for i in chosen if not 0 <= i < count]
    if bad:
        raise UsageError(f"--gpus {gpus}: no GPU {bad[0]} (this machine has {count}: "
                         f"0-{count - 1})")
    return chosen, None


def cmd_run(args: argparse.Namespace) -> int:
    gpus, cpus = resolve_devices(args.gpus, args.cpus)
    headless = args.headless or not sys.stdout.isatty()
    if args.report:
        raise UsageError("ddptui run shows its own dashboard: --report is for ranks started by "
                         "torchrun or srun (see docs/cluster.md)")
    if args.strategy == "dp" and not gpus:
        raise UsageError("--strategy dp needs GPUs: DataParallel splits each batch across them")
    config = config_from_args(args, gpus=gpus, cpus=cpus)
    from ddptui.run.processes import end_helpers
    from ddptui.run.registry import register
    from ddptui.run.supervisor import Supervisor, default_log_path

    # A closed terminal hangs up its whole foreground process group: the fork server, the ranks
    # forked from it and their workers inherit this, and only ddptui decides what a hang-up means.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    policy = from_args(RunPolicy, args)
    supervisor = Supervisor(config, config.telemetry.log or default_log_path(), policy)
    register(supervisor.log_path, supervisor.state.meta)
    try:
        if headless:
            print(f"ddptui: logging to {supervisor.log_path}", flush=True)
            return run_headless(supervisor)
        return run_dashboard(supervisor)
    finally:
        end_helpers()


def cmd_run_script(argv: list[str]) -> int:
    """`ddptui run SCRIPT.py ... -- args` and `ddptui run -m MODULE ...`: the script's ranks."""
    from ddptui.script.options import parse_script_args

    config = parse_script_args(argv, resolve_devices)
    from ddptui.run.registry import register
    from ddptui.script.run import ScriptRun
    from ddptui.view.headless import ScriptConsole

    run = ScriptRun(config)
    register(run.log_path, run.meta)
    if config.headless:
        # stdout is the script's own, as under torchrun: ddptui speaks on stderr.
        print(f"ddptui: logging to {run.log_path}", file=sys.stderr, flush=True)
        return run_headless(run, ScriptConsole(run.state))
    return run_dashboard(run)


def run_dashboard(source: OwnedRun) -> int:
    """The dashboard over a run that ddptui owns (built-in trainer or script) until it ends."""
    from ddptui.view.app import DashboardApp
    from ddptui.view.headless import summary

    app = DashboardApp(source)

    def on_signal(code: int) -> None:
        # Signal handlers run on the app's own thread: call_from_thread would deadlock. Ask the
        # run to stop; the app's refresh tick exits once it is done.
        app.quitting = True
        source.stop(code=code)
        threading.Thread(target=_exit_when_done, args=(source, code), daemon=True).start()

    hung_up = threading.Event()

    def on_hangup(signum, frame) -> None:
        # The terminal is gone: the run goes on without its screen to its own end, as under
        # nohup, and the process exits with the run's code then (docs/dashboard.md).
        hung_up.set()
        _away_from_the_terminal()
        app.detached = True
        threading.Thread(target=_exit_when_done, args=(source, None), daemon=True).start()

    _stop_on_signals(on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    try:
        app.run()
    finally:
        code = source.wait() if hung_up.is_set() else _end_after_dashboard(source)
    if hung_up.is_set():
        return 1 if code is None else code
    if app.crashed:  # the dashboard broke (Textual printed why): the run was stopped
        print(f"ddptui: the dashboard failed (its traceback is above); the run was stopped, "
              f"log: {source.log_path}", file=sys.stderr)
        return 1 if code in (0, 130, None) else code
    view = source.state.view()
    print(f"ddptui: {summary(view)}", flush=True)  # the screen is gone: what it came to
    if code not in (0, None) and view.reason:
        print(f"ddptui: {view.status}: {view.reason}", file=sys.stderr)
    return 1 if code is None else code


def _end_after_dashboard(run: OwnedRun) -> int | None:
    """Whatever the app did (quit, crash, never mounted), the run ends within a bounded time:
    an orderly stop first, then every process at once."""
    if not run.started:
        return None
    if not run.done.is_set():
        run.stop()
        if not run.done.wait(STOP_GRACE_S + 5):
            run.stop()  # a second stop ends every process at once
    return run.wait(60)


def _exit_when_done(run: OwnedRun, code: int | None) -> None:
    """A terminal that closed (SIGHUP, with SIGCONT from the kernel) can leave Textual blocked
    writing to it forever. Once the run is done every process of the run has ended and the
    log is closed, so after a grace period for the app to restore the terminal, the process ends."""
    run.wait()
    time.sleep(EXIT_GRACE_S)
    from ddptui.run.processes import end_helpers

    end_helpers()
    os._exit(code if code is not None else 1 if run.exit_code is None else run.exit_code)


def _away_from_the_terminal() -> None:
    """A hung-up terminal fails or blocks every read and write: the process's standard streams
    go to /dev/null instead."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def run_headless(run: OwnedRun, console=None) -> int:
    from ddptui.view.headless import HeadlessConsole

    console = console or HeadlessConsole(run.state)
    _stop_on_signals(lambda code: run.stop(code=code))
    run.start()
    while not run.done.wait(0.25):
        console.poll()
    console.finish()
    code = run.exit_code
    view = run.state.view()
    if code == 2 and view.status != "failed":  # bad input to ddptui, not a script's exit
        print(f"ddptui: error: {view.reason}", file=sys.stderr)
    elif code not in (0, None) and view.reason:
        print(f"ddptui: {view.status}: {view.reason}", file=sys.stderr)
    return 1 if code is None else code


def _stop_on_signals(stop) -> None:
    """Ctrl-C -> 130, SIGTERM -> 143, SIGHUP -> 129 (the headless console's; the dashboard's run
    outlives its terminal): an orderly stop; a second one is immediate."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stop(128 + signum))


def cmd_attach(args: argparse.Namespace) -> int:
    from ddptui.contract.channel import load_key, parse_address

    try:
        address = parse_address(args.listen, "--listen")
        key, source = load_key(create=True)
    except ValueError as e:  # a bad address, or NoKey
        raise UsageError(str(e)) from None
    log = args.log or os.path.join("runs", time.strftime("attach-%Y-%m-%dT%H-%M-%S.jsonl"))
    from ddptui.options.training import check_writable_file

    check_writable_file(log, "--log")
    from ddptui.sources.attach import Attach

    try:
        attach = Attach(address, key, log, source, args.stall_after, args.grace)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.listen}: {e.strerror}") from None
    headless = args.headless or not sys.stdout.isatty()
    if headless:
        print(f"ddptui: listening on {args.listen} (key: {source}); start ranks with "
              f"--report {args.listen}; logging to {log}", flush=True)
        return run_headless(attach)
    from ddptui.view.app import DashboardApp

    DashboardApp(attach).run()
    attach.stop(code=0)
    return 0


def cmd_ls(_args: argparse.Namespace) -> int:
    from ddptui.run.registry import runs

    try:
        found = runs()
    except PermissionError as e:
        raise UsageError(str(e)) from None
    if not found:
        print("no runs of this user on this machine")
        return 0
    now = time.time()
    rows = [("NAME", "STATE", "PID", "RANKS", "AGE", "WHAT", "LOG")] + [
        (r.name, r.state, str(r.pid), str(r.ranks), _age(now - r.started), r.what[:40], r.log)
        for r in found]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:6], widths, strict=True)) + "  " + row[6])
    return 0


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def cmd_gpus(_args: argparse.Namespace) -> int:
    from ddptui.run.nvml import format_gpus, list_gpus

    print(format_gpus(list_gpus()))
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.file):
        raise UsageError(f"no such log: {args.file}")
    if args.speed < 0:
        raise UsageError(f"--speed must be 0 or more, got {args.speed}")
    from ddptui.sources.replay import Replay, not_a_log

    why = not_a_log(args.file)
    if why:
        raise UsageError(f"{args.file} is not a ddptui log: {why}")
    if args.csv is not None:
        return _epochs_csv(args.file, args.csv)

    replay = Replay(args.file, speed=args.speed)
    if args.headless or not sys.stdout.isatty():
        return run_headless(replay)
    from ddptui.view.app import DashboardApp

    DashboardApp(replay).run()
    return 0


def _epochs_csv(log: str, target: str) -> int:
    from ddptui.contract.events import count
    from ddptui.sources.export import write_epochs_csv

    def warn(text: str) -> None:
        print(f"ddptui: warning: {text}", file=sys.stderr)

    if target == "-":
        write_epochs_csv(log, sys.stdout, warn)
        return 0
    try:
        with open(target, "w", newline="") as out:
            rows = write_epochs_csv(log, out, warn)
    except OSError as e:
        raise UsageError(f"cannot write {target}: {e.strerror or e}") from None
    print(f"ddptui: {count(rows, 'epoch row')} written to {target}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    bytecode.enable()  # before textual, and before any rank starts
    argv = sys.argv[1:] if argv is None else argv
    from ddptui.script.options import is_script_form

    if is_script_form(argv):
        return _guarded(cmd_run_script, argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {"run": cmd_run, "attach": cmd_attach, "gpus": cmd_gpus, "replay": cmd_replay,
                "ls": cmd_ls}
    if args.command not in handlers:
        parser.print_help()
        return 2
    return _guarded(handlers[args.command], args)


def _guarded(handler, args) -> int:
    try:
        return handler(args)
    except UsageError as e:
        print(f"ddptui: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
