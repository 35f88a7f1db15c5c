"""The script form of `ddptui run`: torchrun's command line, `ddptui run [options] train.py
[script args]` or `-m pkg.module`, told apart from the built-in trainer's `ddptui run MODEL`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
from dataclasses import dataclass

from ddptui.contract.observe.launchers import local_rank_flag, parse, source_of, starts_ranks
from ddptui.contract.observe.streams import Routing, ranks_filter, std_spec
from ddptui.contract.observe.target import module_problem
from ddptui.contract.options.argtypes import non_negative_int, positive_float, positive_int
from ddptui.contract.options.devices import resolve_devices
from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.monitor import MonitorOptions, MonitorPlan, monitor_plan
from ddptui.contract.options.parser import Parser, add_sections, flags, from_args, option, switches
from ddptui.contract.options.training import check_tensorboard, check_writable_dir, check_writable_file
from ddptui.contract.stalls.scripts import STALL_S

GRACE_S = 30.0  # torchrun's: SIGINT or SIGTERM to the ranks, then SIGKILL after this long

DETACH_HELP = ("start the run in the background and return at once, printing its name and log "
               "(ddptui attach NAME watches it)")
DETACH_OR_HEADLESS = ("--detach and --headless: choose one (--headless runs in this terminal and "
                      "ends with it)")

TORCHRUN = "torchrun's options, same meaning (one machine)"
FORMS = """your own script (torchrun's contract and command line, no code change):
  ddptui run --nproc-per-node 2 --standalone train.py --lr 0.1 --epochs 3
  ddptui run --cpus 2 -m mypkg.train --config small.yaml
  ddptui run train.py --gpus 0,1 -- --lr 0.1     (ddptui options after the script, then --)
  ddptui run --gpus all --metric acc --metric top5=top-5:\\s*([\\d.]+) train.py
  three lines in the script add per-rank loss and samples: see README, "Your own script"
  Lightning, the Hugging Face Trainer and Keras get ddptui's callback where the script has none
  a script that starts its own ranks (mp.spawn, Lightning's ddp_spawn, accelerate launch) runs
  once, as their launcher, each rank shown (found in the script, or when it launches)
"""


@dataclass(frozen=True)
class ScriptConfig:
    """What the script form asks for; the launch and the watch, never the training. Each option
    field declares its flag and help (ddptui/contract/options/parser.py)."""

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
    detach: bool = option(False, DETACH_HELP, action="store_true")
    log: str | None = option(None, "telemetry log (default runs/<time>.jsonl; each rank's output "
                             "beside it as .rankN.out)", metavar="FILE.jsonl")
    tensorboard: str | None = option(
        None, "also write every rank's scalars for TensorBoard in DIR: loss, the epochs' "
        "figures, GPU load (needs the tensorboard package)", metavar="DIR")
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
    no_python: bool = option(
        False, "run SCRIPT as a program, not with python (a shell script, a binary); torchrun's "
        "environment as for a Python script", group=TORCHRUN, action="store_true")
    log_dir: str | None = option(
        None, "with --redirects or --tee: each rank's stdout.log, stderr.log (and error.json) "
        "under DIR/<run id>_*/attempt_<n>/<local rank>/, as torchrun writes them", group=TORCHRUN,
        metavar="DIR")
    redirects: str = option(
        "0", "these streams to --log-dir's files and not the console: 1 stdout, 2 stderr, 3 both, "
        "or per local rank (0:3,1:2) (headless; every rank's output is in its .rankN.out)",
        group=TORCHRUN, type=std_spec, metavar="STD")
    tee: str = option(
        "0", "these streams to the console line by line after a prefix, and to --log-dir's "
        "files; values as --redirects", group=TORCHRUN, type=std_spec, metavar="STD")
    local_ranks_filter: tuple[int, ...] | None = option(
        None, "only these local ranks' output on the console (0 or 0,1); files keep all",
        group=TORCHRUN, type=ranks_filter, metavar="LIST")
    log_line_prefix_template: str | None = option(
        None, "the prefix of a tee'd line: ${role_name} ${rank} ${local_rank} ${hostname} "
        "(default [${role_name}${local_rank}]:, or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)",
        group=TORCHRUN, metavar="TEMPLATE")
    launch: str = ""  # how the script starts its own ranks, said in one line ("" it does not)
    # The script may turn out to start ranks of its own (from inside a library) as it runs: it
    # is then started again as their launcher. Not where --nproc-per-node N asked for N copies.
    relaunch: bool = True
    local_rank_flag: str = ""  # --local_rank: the script reads torch.distributed.launch's form
    stacks_signal: int = option(
        int(signal.SIGUSR1), "the signal that makes a rank write its Python stacks (t) (default "
        "SIGUSR1; pick another if your script handles that one)", group="watch", metavar="SIG",
        default="SIGUSR1")
    monitor: MonitorPlan | None = None  # --metrics and --notify, checked (MonitorOptions)

    @property
    def routing(self) -> Routing:
        return Routing(self.redirects, self.tee, self.local_ranks_filter,
                       self.log_line_prefix_template, self.log_dir)

    @property
    def world_size(self) -> int:
        """The processes ddptui starts: one launcher for a script that starts its own ranks."""
        if self.launch:
            return 1
        return len(self.gpus) if self.gpus else (self.cpus or 1)

    @property
    def device_kind(self) -> str:
        return "cuda" if self.gpus else "cpu"

    @property
    def label(self) -> str:
        """How the header names the job: what the user typed, shortened."""
        return ("-m " if self.module else "") + (self.target if self.module
                                                 else os.path.basename(self.target))


# torchrun's options for one node that ddptui does otherwise: read, said, not applied.
NOT_APPLIED = {
    "--rdzv-backend": "ddptui makes the ranks' rendezvous itself, on this machine",
    "--rdzv-endpoint": "ddptui makes the ranks' rendezvous itself, on this machine",
    "--rdzv-id": "ddptui makes the ranks' rendezvous itself, on this machine",
    "--rdzv-conf": "ddptui makes the ranks' rendezvous itself, on this machine",
    "--master-addr": "ddptui sets MASTER_ADDR for the ranks (127.0.0.1)",
    "--master-port": "ddptui picks a free MASTER_PORT for the ranks",
    "--monitor-interval": "ddptui watches the ranks twice a second",
    "--role": "every rank is a trainer here",
    "--run-path": "the script runs as __main__ in each rank's python, as without it",
}
# torchrun's options that ddptui run cannot carry out yet: one line, exit 2.
NOT_YET = ("--start-method", "--local-addr", "--node-rank")
FLAG_ONLY = {"--standalone", "--run-path", "-h", "--help"}  # and ScriptConfig's switches


def is_script_form(argv: list[str]) -> bool:
    """`run`, options, then -m, a .py path or an existing file (a model name is none of
    these), as torchrun's command line has it."""
    if len(argv) < 2 or argv[0] != "run":
        return False
    try:
        before, target, module, _ = _locate(argv[1:])
    except UsageError:  # a bad option: said by the form it was meant for
        return any(a in ("-m", "--module", "--no-python") or a.endswith(".py")
                   for a in argv[1:])
    return (module or "--no-python" in before or target.endswith(".py")
            or os.path.exists(target))


def build_script_parser() -> Parser:
    p = Parser(prog="ddptui run", formatter_class=argparse.RawDescriptionHelpFormatter,
               usage="ddptui run [OPTIONS] SCRIPT.py|-m MODULE [SCRIPT ARGS...]",
               description="Run your own torchrun script, one process per GPU (or CPU rank), "
               "with the environment torchrun --standalone gives it, and watch every rank. "
               "As with torchrun, options go before the script and what follows it is the "
               "script's (ddptui options right after the script are read only when a -- closes them "
               "or nothing else follows). "
               "A script that starts its own ranks (mp.spawn, start_processes, "
               "multiprocessing.Process, elastic_launch) is run once, each rank it starts shown.",
               epilog=FORMS)
    torchrun = add_sections(p, ScriptConfig, MonitorOptions)[TORCHRUN]
    torchrun.add_argument("--nproc-per-node", metavar="N|gpu|auto|cpu",
                          help="N ranks: GPUs 0..N-1 of CUDA_VISIBLE_DEVICES' list, or N CPU "
                          "ranks where there is no GPU; gpu or auto: every GPU")
    torchrun.add_argument("--standalone", action="store_true",
                          help="accepted: ddptui always runs the rendezvous on this machine")
    torchrun.add_argument("--nnodes", metavar="1", help="accepted when 1: one machine")
    for flag, why in NOT_APPLIED.items():
        torchrun.add_argument(flag, help=f"accepted, not applied: {why}", **(
            {"action": "store_true"} if flag in FLAG_ONLY else {"metavar": "X"}))
    return p


def parse_script_args(argv: list[str]) -> ScriptConfig:
    """argv after `run`; raises UsageError with one line for anything wrong."""
    before, target, module, after = _locate(argv)
    ours, script_args = _split(after)
    args = build_script_parser().parse_args([*before, *ours, "--", target])
    for flag, why in NOT_APPLIED.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False):
            print(f"ddptui: note: {flag} does not apply: {why}", file=sys.stderr)
    if args.detach and args.headless:
        raise UsageError(DETACH_OR_HEADLESS)
    if args.nnodes not in (None, "1", "1:1"):
        raise UsageError(f"--nnodes {args.nnodes}: ddptui run is one machine; on several, "
                         "launch with torchrun and watch with ddptui attach (docs/cluster.md)")
    _check_target(target, module, args.no_python)
    if args.log:
        check_writable_file(args.log, "--log")
    if args.log_dir:
        check_writable_dir(args.log_dir, "--log-dir")
    if args.tensorboard:
        check_tensorboard(args.tensorboard)
    gpus, cpus = resolve_devices(*_devices(args))
    said, flag = "", ""
    if not args.no_python:
        said, flag = _launch_form(target, module, args.nproc_per_node,
                                  len(gpus) if gpus else cpus or 1)
    return from_args(
        ScriptConfig, args, module=module, args=tuple(script_args), gpus=gpus, cpus=cpus,
        launch=said, local_rank_flag=flag,
        relaunch=args.nproc_per_node in (None, "1", "gpu", "auto"),
        headless=args.headless or not sys.stdout.isatty(),
        metrics=tuple(_metric(m) for m in args.metric or ()),
        monitor=monitor_plan(from_args(MonitorOptions, args)),
        stacks_signal=_signal(args.stacks_signal))


def _launch_form(target: str, module: bool, nproc: str | None, n: int) -> tuple[str, str]:
    """(the line that says the script starts its own ranks, when ddptui runs it once; the
    --local_rank spelling to give each rank), each said on stderr, from the script's source."""
    name = target if module else os.path.basename(target)
    tree = parse(source_of(target, module))
    launch = starts_ranks(tree)
    if launch and nproc in (None, "1", "gpu", "auto"):
        print(f"ddptui: {launch.said(name)}", file=sys.stderr)
        return launch.said(name), ""
    if launch:
        print(f"ddptui: note: {launch.found(name)}; --nproc-per-node {nproc} starts that many "
              f"copies of it, which may collide (ddptui run --nproc-per-node 1 {target} runs it "
              "once)", file=sys.stderr)
        return "", ""
    flag = "" if module else local_rank_flag(tree) or ""
    if flag and n > 1:
        print(f"ddptui: {name} takes {flag} (torch.distributed.launch's form): each rank gets "
              f"{flag}=N, as launch gave it", file=sys.stderr)
    return "", flag


def _locate(argv: list[str]) -> tuple[list[str], str, bool, list[str]]:
    """(ddptui's options before the script, the script or module, -m given, what follows)."""
    before: list[str] = []
    while len(before) < len(argv):
        a = _dashed(argv[len(before)])
        i = len(before)
        if a in ("-m", "--module"):
            if i + 1 == len(argv) or argv[i + 1].startswith("-"):
                raise UsageError("-m needs a module name: ddptui run -m pkg.train")
            return before, argv[i + 1], True, argv[i + 2:]
        if not a.startswith("-"):
            return before, a, False, argv[i + 1:]
        _check_flag(a)
        before += [a] if "=" in a or _switch(a) else [a, *argv[i + 1:i + 2]]
    raise UsageError("no script given: ddptui run [options] SCRIPT.py|-m MODULE [args]")


def _split(after: list[str]) -> tuple[list[str], list[str]]:
    """What follows the script is the script's, as torchrun has it, except ddptui's own options
    right after it when a -- closes them (`train.py --gpus 0,1 -- --lr 0.1`) or nothing else
    follows (`train.py --cpus 2`): a script or module that takes torchrun's options itself
    (`-m torch.distributed.run --nproc-per-node 2 train.py`) gets them all."""
    ours: list[str] = []
    i = 0
    while i < len(after) and _known(_dashed(after[i])):
        a = _dashed(after[i])
        n = 1 if "=" in a or _switch(a) else 2
        ours += [a, *after[i + 1:i + n]]
        i += n
    if after[i:i + 1] == ["--"] or ours and i == len(after):
        return ours, after[i + 1:]
    return [], after


def _dashed(arg: str) -> str:
    """torchrun's underscore spellings (--nproc_per_node) as the dashed ones."""
    flag, eq, value = arg.partition("=")
    dashed = flag.replace("_", "-")
    return dashed + eq + value if flag.startswith("--") and _known(dashed) else arg


def _check_flag(flag: str) -> None:
    name = flag.split("=", 1)[0]
    if name in NOT_YET:
        raise UsageError(f"torchrun's {name} is not supported by ddptui run yet (each rank's "
                         "output is in its .rankN.out file beside the log)")
    if not _known(name):
        raise UsageError(f"{name} is not a ddptui run option (ddptui run --help); the "
                         "script's own arguments go after the script")


def _switch(flag: str) -> bool:
    """An option that takes no value."""
    return flag in FLAG_ONLY or flag in switches(ScriptConfig)


def _known(flag: str) -> bool:
    return flag.split("=", 1)[0] in {"-h", "--help", "--nproc-per-node", "--standalone",
                                     "--nnodes", *NOT_APPLIED, *flags(ScriptConfig)}


def _devices(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """--nproc-per-node in --gpus/--cpus terms."""
    n = args.nproc_per_node
    if n is None:
        return args.gpus, args.cpus
    if args.gpus is not None or args.cpus is not None:
        raise UsageError("use one of --nproc-per-node, --gpus or --cpus")
    if n in ("gpu", "auto"):
        return "all", None
    if n == "cpu":
        return None, os.cpu_count() or 1
    try:
        count = positive_int(n)
    except argparse.ArgumentTypeError:
        raise UsageError(f"bad --nproc-per-node {n!r}: a number, gpu, auto or cpu") from None
    from ddptui.contract.nvml import gpu_count

    if not gpu_count():
        return None, count
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    order = list(range(gpu_count())) if visible is None else [
        int(x) for x in visible.split(",") if x.strip().isdigit()]
    if count > len(order):
        raise UsageError(f"--nproc-per-node {count}: this machine shows {len(order)} GPU(s)")
    return ",".join(str(g) for g in order[:count]), None


def _check_target(target: str, module: bool, no_python: bool) -> None:
    if no_python:
        if module:
            raise UsageError("--no-python and -m cannot go together (as with torchrun)")
        if shutil.which(target) is None:
            raise UsageError(f"--no-python: {target} is not a program this machine can run "
                             "(a path to an executable file, or a command on PATH)")
    elif module:
        problem = module_problem(target)
        if problem:
            raise UsageError(f"{problem} (ddptui run -m imports it from {os.getcwd()} and the "
                             "installed packages)")
    elif os.path.isdir(target):
        raise UsageError(f"{target} is a folder: name the script in it "
                         f"(ddptui run {os.path.join(target, 'train.py')})")
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
