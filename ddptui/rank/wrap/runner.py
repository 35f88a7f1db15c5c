"""`python -m ddptui.wrap SCRIPT [ARGS]` (or `-m MODULE [ARGS]`) between a launcher and an
unmodified script: `torchrun ... -m ddptui.wrap train.py`, `srun python -m ddptui.wrap train.py`.

The script runs as `__main__` as without it (its argv, exit code, signals, exceptions); with
DDPTUI_REPORT=HOST:PORT each rank also reports to `ddptui attach` (ddptui/rank/wrap/rankwatch.py).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from ddptui.contract.observe.launchers import parse, source_of, starts_ranks
from ddptui.contract.observe.target import module_problem

USAGE = "usage: python -m ddptui.wrap SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"
# srun's variables as torchrun's, for a script that reads torchrun's (env:// rendezvous).
SLURM = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID",
         "LOCAL_WORLD_SIZE": "SLURM_NTASKS_PER_NODE", "GROUP_RANK": "SLURM_NODEID"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] == "-m" and len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    if not module and not os.path.isfile(target):
        print(f"ddptui.wrap: no such script: {target}", file=sys.stderr)
        return 2
    for name, slurm in SLURM.items():
        if name not in os.environ and slurm in os.environ:
            os.environ[name] = os.environ[slurm].split("(")[0]  # '2(x3)': SLURM's repeat form
    sys.argv = [target, *args]  # as the script sees it, and as attach names the job
    # As `python -m pkg.mod` would, this imports pkg (with the environment and argv above).
    missing = module_problem(target) if module else None
    if missing:
        print(f"ddptui.wrap: {missing}", file=sys.stderr)
        return 2
    watch = _watch(target, module)
    if not module:  # as `python train.py`: its folder first on the path
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    try:
        code, failure = _run(target, module, watch)
    finally:
        if watch is not None:
            watch.close()
        _free_process_groups()
    if failure is not None:  # as Python prints it, from the script's own first frame
        sys.excepthook(type(failure), failure, failure.__traceback__)
        return 1
    return code


def _run(target: str, module: bool, watch) -> tuple[int, Exception | None]:
    """(its exit code, the exception it raised) as `python SCRIPT` or `python -m MODULE` run
    it; SystemExit and KeyboardInterrupt go on up, as they would."""
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(target), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if watch is not None and code:
            watch.finished(code)
        raise
    except Exception as e:
        e.__traceback__ = _script_frames(e.__traceback__)
        if watch is not None:
            lines = "".join(traceback.format_exception(e)).rstrip("\n").splitlines()
            watch.failed(e, lines[-8:], 1)
        return 1, e
    if watch is not None:
        watch.finished(0)
    return 0, None


def _script_frames(tb):
    """The traceback from the script's first frame: the wrapper's and runpy's left out."""
    ours = {os.path.abspath(__file__), runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in ours:
        tb = tb.tb_next
    return tb


def _free_process_groups() -> None:
    """gloo's worker threads freed after the script, not while Python finalizes: one that frees
    its last work then aborts the finished rank (why: ddptui/rank/inject/sitecustomize.py)."""
    if "torch.distributed" in sys.modules:
        import gc
        import time

        gc.collect()
        time.sleep(0.05)


def _watch(target: str, module: bool):
    """The rank's watch when attach is listening (DDPTUI_REPORT), else None; none for a script
    that starts its own ranks, each of which reports as the rank it joins as."""
    report = os.environ.get("DDPTUI_REPORT")
    if not report:
        return None
    name = target if module else os.path.basename(target)
    launch = starts_ranks(parse(source_of(target, module)))
    if launch:
        from ddptui.rank.wrap.spawned import report_ranks

        print(f"ddptui.wrap: {launch.found(name)}: each rank it starts reports to attach",
              file=sys.stderr)
        report_ranks(name)
        return None
    from ddptui.rank.wrap.rankwatch import RankWatch

    watch = RankWatch(report, int(os.environ.get("RANK", 0)),
                      int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
    watch.start(os.path.basename(target))
    return watch
