"""Loaded by every Python process started with ddptui's inject/ folder on PYTHONPATH; acts only
in a rank that ddptui started itself: dies with ddptui, writes its stacks on a signal.

Then hands over to the sitecustomize this one shadows, if there is one.
"""

import os


def _settle() -> None:
    """At exit, before Python finalizes: free what is left of torch.distributed's process groups
    and let their threads take the GIL once more. A gloo worker thread frees its last finished
    work (which holds a Python object) a moment after the collective returns; if the
    interpreter is finalizing by then, Python ends that thread inside C++ and the rank aborts
    ("terminate called without an active exception") after the script has finished, under
    torchrun as well, most often on a loaded machine."""
    import sys

    if "torch.distributed" not in sys.modules:
        return
    import gc
    import time

    gc.collect()  # a process group no longer used is destroyed now, its threads joined
    time.sleep(0.05)  # one still held by the script's globals: its threads get the GIL


def _is_rank() -> bool:
    """The rank ddptui started itself, not a subprocess of it (a DataLoader worker, a
    compiler): those have the rank as their parent, and the rank ends them its own way. Under
    --no-python the rank's program is the parent named (a shell script's python), or it became
    python itself (exec)."""
    return os.environ.get("DDPTUI_PARENT") in (str(os.getppid()), str(os.getpid()))


def _arm() -> None:
    parent = os.environ.get("DDPTUI_PARENT", "")
    if not parent.isdigit():
        return
    if not _is_rank():
        try:
            os.kill(int(parent), 0)
        except ProcessLookupError:  # ddptui died before this rank could tie itself to it
            os._exit(1)
        return
    ppid = os.getppid()
    import atexit
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def watch() -> None:  # a parent that died before prctl, or another OS
        while os.getppid() == ppid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="ddptui-parent-watch", daemon=True).start()
    atexit.register(_settle)  # registered first, so run after the script's own exit handlers
    path = os.environ.get("DDPTUI_STACKS")
    if path:
        # faulthandler writes from C: it answers while the main thread is stuck in a call that
        # never returns. Appending: ddptui empties the file before each request.
        from ddptui.rank.stacks import answer_stacks

        answer_stacks(int(os.environ.get("DDPTUI_STACKS_SIGNAL", signal.SIGUSR1)),
                      open(path, "a"))
    vitals = os.environ.get("DDPTUI_VITALS")
    if vitals:
        from ddptui.rank.telemetry.vitals import keep_vitals

        keep_vitals(vitals, os.environ.get("DDPTUI_PHASES"))


def _ranks() -> None:
    """A script that starts its own ranks: each process that joins a process group is shown as
    a rank of its own (ddptui/rank/wrap/spawned.py); the launcher tells how its children end. A
    rank that turns out to start ranks from inside a library says so (selflaunch.py)."""
    if os.environ.get("DDPTUI_RELAUNCH") and _is_rank():
        from ddptui.rank.wrap.selflaunch import guard

        guard()
    if not os.environ.get("DDPTUI_RANKS") and not os.environ.get("DDPTUI_WRAP_RANKS"):
        return
    from ddptui.rank.wrap.spawned import install

    install(launcher=_is_rank())


def _frameworks() -> None:
    """Lightning, the Hugging Face Trainer and Keras get ddptui's callback where the script
    gives none, in a rank of a script's run or a process its launcher starts."""
    if not os.environ.get("DDPTUI_REPORT") or not (
            _is_rank() or os.environ.get("DDPTUI_RANKS") or os.environ.get("DDPTUI_RELAUNCH")):
        return
    from ddptui.rank.integrations.auto import install

    install()


def _chain() -> None:
    """Run the next sitecustomize on the path (a virtualenv's, a distribution's) as well."""
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _arm()
    _ranks()
    _frameworks()
finally:
    _chain()
